"""Which team store a command uses: options over the environment over the site file, and every
setting that carries a secret, or names half a store, refused in one line (pure: no server)."""

from __future__ import annotations

import pytest

from fleet.store.team.config import TeamConfigError, resolve

URL = "postgresql://db.example.org/fleet"


def test_no_setting_anywhere_means_the_embedded_store_alone(tmp_path, monkeypatch):
    monkeypatch.setattr("fleet.store.team.config.SITE_FILES", (tmp_path / "site.toml",))
    assert resolve(environ={}) is None


def test_options_win_over_the_environment_which_wins_over_the_site_file(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text(f'catalog = "{URL}"\nobjects = "s3://site-bucket/team"\n')
    env = {"FLEET_SITE_CONFIG": str(site)}
    assert str(resolve(environ=env).objects) == "s3://site-bucket/team"
    assert resolve(environ=env).source == str(site)
    env["FLEET_OBJECTS"] = "s3://env-bucket/p/q"
    team = resolve(environ=env)
    assert team.objects.bucket == "env-bucket" and team.objects.prefix == ("p", "q") and team.catalog == URL
    assert resolve(objects="s3://opt-bucket", environ=env).objects.prefix == ()
    assert resolve(objects="s3://opt-bucket", environ=env).objects.bucket == "opt-bucket"


@pytest.mark.parametrize("catalog, objects, said", [
    ("postgresql://alice:hunter2@db/fleet", "s3://b-1/x", "holds a password"),
    ("host=db password=hunter2 dbname=fleet", "s3://b-1/x", "holds a password"),
    ("postgresql://db/fleet?password=hunter2", "s3://b-1/x", "holds a password"),
    ("mysql://db/fleet", "s3://b-1/x", "neither a postgresql:// URL"),
    (URL, "s3://AKIA:secret@b-1/x", "carries more than"),
    (URL, "https://b-1/x", "is not s3://BUCKET/PREFIX"),
    (URL, "s3://Bad_Bucket/x", "not an S3 bucket name"),
    (URL, "s3://b-1/../x", "the prefix word '..'"),
    (URL, None, "needs both a catalog and objects"),
])
def test_a_setting_that_holds_a_secret_or_is_not_of_its_shape_is_refused_in_one_line(catalog, objects, said):
    with pytest.raises(TeamConfigError) as refused:
        resolve(catalog=catalog, objects=objects, environ={})
    assert said in str(refused.value) and "\n" not in str(refused.value) and "hunter2" not in str(refused.value)


def test_a_site_file_with_an_unknown_key_or_a_wrong_type_is_refused(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text(f'catalog = "{URL}"\nobjects = "s3://b-1"\nsecret_key = "x"\n')
    with pytest.raises(TeamConfigError, match="unknown key"):
        resolve(environ={"FLEET_SITE_CONFIG": str(site)})
    site.write_text("catalog = 3\n")
    with pytest.raises(TeamConfigError, match="must be a string"):
        resolve(environ={"FLEET_SITE_CONFIG": str(site)})
    with pytest.raises(TeamConfigError, match="does not exist"):
        resolve(environ={"FLEET_SITE_CONFIG": str(tmp_path / "none.toml")})
