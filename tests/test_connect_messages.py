"""Why a host could not be reached, in words: DNS, a silent server, authentication with -v."""

from __future__ import annotations

import socket

import yaml

from tests.conftest import fleet_json_lines, run_fleet


def one_host_inventory(tmp_path, **vars) -> dict[str, str]:
    """The environment for fleet with an inventory of one host, ``h``, and an empty ssh_config."""
    (tmp_path / "ssh_config").write_text("")
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump({"all": {"hosts": {"h": vars}}}))
    return {"FLEET_SSH_CONFIG": str(tmp_path / "ssh_config"), "FLEET_INVENTORY": str(tmp_path / "inv.yaml")}


def test_a_name_that_does_not_resolve_is_said_in_words(tmp_path):
    out = run_fleet("exec", "--json", "h", "true", env=one_host_inventory(tmp_path, ansible_host="no-such-host.invalid"))
    assert out.returncode == 3
    [line] = fleet_json_lines(out.stdout)
    assert line["error_kind"] == "unreachable"
    assert "cannot resolve 'no-such-host.invalid'" in line["error"] and "unknown error" not in line["error"]


def test_an_address_that_accepts_tcp_and_never_answers_has_no_ssh_banner(tmp_path):
    with socket.socket() as silent:  # the kernel accepts connections into the backlog; nothing ever writes
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        env = one_host_inventory(tmp_path, ansible_host="127.0.0.1", ansible_port=silent.getsockname()[1])
        out = run_fleet("--connect-timeout", "1.5", "exec", "--json", "h", "true", env=env)
    assert out.returncode == 3
    [line] = fleet_json_lines(out.stdout)
    assert line["error_kind"] == "connect-timeout"
    assert "accepted the TCP connection but sent no SSH banner within 1.5 s" in line["error"]


def test_connect_timeout_is_a_positive_number():
    out = run_fleet("--connect-timeout", "0", "exec", "local", "true")
    assert out.returncode == 2 and "--connect-timeout" in out.stderr


def test_debug_shows_how_authentication_failed(cluster, tmp_path):
    doc = yaml.safe_load(cluster.inventory.read_text())
    doc["all"]["children"]["cluster"]["hosts"]["h01"]["ansible_user"] = "nosuchuser"
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(doc))
    env = {**cluster.env(), "FLEET_INVENTORY": str(tmp_path / "inv.yaml")}
    quiet = run_fleet("exec", "h01", "true", env=env)
    loud = run_fleet("-v", "exec", "h01", "true", env=env)
    assert quiet.returncode == loud.returncode == 3
    assert "refused our keys" in loud.stderr and "fleet debug:" not in quiet.stderr
    debug = [line for line in loud.stderr.splitlines() if line.startswith("fleet debug:")]
    assert any("nosuchuser" in line and "auth" in line.lower() for line in debug), loud.stderr
