"""The command line parses as srun, clush and nsys do: fleet's options end at the workload's first word.

Each test is one of the misparses found when `profile` and `exec` let unknown options through
into the workload. They run on this machine (fleet's embedded inventory), without SSH.
"""

from __future__ import annotations

import pytest

from tests.conftest import fleet_json, fleet_json_lines, run_fleet


def _dry_run_command(*args: str, store) -> list[str]:
    """The workload a lab `profile --dry-run` would run here, as fleet parsed it."""
    out = run_fleet("profile", "--group", "local", "--dry-run", "--json", "--store", str(store), *args)
    assert out.returncode in (0, 5), out.stderr  # 5: refused here (no nsys), which is fine for parsing
    return fleet_json(out.stdout)["request"]["command"]


def test_a_misspelt_option_is_refused_with_a_suggestion_not_profiled(tmp_path):
    out = run_fleet("profile", "--hosts", "h", "--tol", "ncu", "--", "./app", "--store", str(tmp_path))
    assert out.returncode == 2
    assert "No such option '--tol'" in out.stderr and "--tool" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1  # one line, no usage dump
    assert not list(tmp_path.iterdir())  # nothing was started or written


def test_a_removed_option_is_an_error_not_the_program(tmp_path):
    out = run_fleet("profile", "--out", str(tmp_path / "d"), "--group", "local", "--", "./app")
    assert out.returncode == 2
    assert "No such option '--out'" in out.stderr
    assert not (tmp_path / "d").exists()


def test_the_workloads_own_options_stay_the_workloads(tmp_path):
    # -n is --ntasks for a Slurm job, --json fleet's: after the first word of the workload both are its own.
    assert _dry_run_command("python", "train.py", "-n", "4", "--json", store=tmp_path) == \
        ["python", "train.py", "-n", "4", "--json"]
    # With "--" as before, and fleet's own options still read before the workload.
    assert _dry_run_command("--tool", "nsys", "--", "./app", "--tool", "x", store=tmp_path) == ["./app", "--tool", "x"]


def test_exec_passes_help_and_short_options_to_the_remote_command():
    out = run_fleet("exec", "local", "echo", "-h")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "-h\n"  # not fleet's help
    listed = run_fleet("exec", "local", "ls", "-d", "-x", "/")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "/"  # "/" is ls's argument, not a target; -x is ls's, not --exclude


def test_exec_reads_its_own_options_on_both_sides_of_targets():
    out = run_fleet("exec", "--json", "local", "--timeout", "30", "echo", "--json")
    assert out.returncode == 0, out.stderr
    [line] = fleet_json_lines(out.stdout, "exec")
    assert line["stdout"] == "--json\n"


def test_global_options_after_the_subcommand_get_a_hint():
    for argv, option in ((["exec", "-f", "8", "local", "true"], "-f"),
                         (["profile", "-i", "inv.yaml", "--group", "local", "--", "true"], "-i"),
                         (["inventory", "list", "--inventory", "inv.yaml"], "--inventory")):
        out = run_fleet(*argv)
        assert out.returncode == 2, argv
        assert f"{option} is a global option: put it before the command" in out.stderr


def test_slurm_options_on_lab_servers_are_refused_with_a_pointer(tmp_path):
    out = run_fleet("profile", "--group", "local", "--gpus", "2", "-N", "4", "--store", str(tmp_path), "--", "true")
    assert out.returncode == 2
    assert "--nodes/-N" in out.stderr and "--gpus" in out.stderr and "--partition" in out.stderr
    assert not list(tmp_path.iterdir())


def test_lab_options_with_a_partition_are_refused_with_a_pointer():
    for option, pointer in ((["--gpu", "1"], "--gres"), (["--timeout", "5"], "--time"),
                            (["--docker", "img"], "--container-image"), (["-x", "n1"], "--exclude=")):
        out = run_fleet("profile", "--partition", "gpu", *option, "--", "true")
        assert out.returncode == 2, option
        assert pointer in out.stderr, out.stderr


def test_since_takes_a_date_and_refuses_what_it_cannot_read(tmp_path):
    out = run_fleet("reports", "ls", "--since", "yesterday", "--store", str(tmp_path))
    assert out.returncode == 2
    assert "'yesterday' is not a date" in out.stderr
    assert run_fleet("reports", "ls", "--since", "2024-05-31", "--store", str(tmp_path)).returncode == 0


@pytest.mark.parametrize("args, said", [
    (["--launcher", "ray", "--tool", "ncu", "--dry-run"], "only an nsys trace"),
    (["--launcher", "torchrun"], "no program found after the torchrun options"),
    (["--launcher", "mpirun", "--dry-run"], "no program found after the mpirun options"),
    (["--launcher", "ray", "--container-image", "nvcr.io/x"], "Ray starts its workers itself"),
    (["--launcher", "mpirun", "--container-image", "nvcr.io/x"], "pyxis cannot put them in the image"),
])
def test_a_slurm_usage_error_exits_2_before_the_login_node_is_asked(tmp_path, args, said):
    """These exited 1 after a round trip to the login node; here no login node listens at all."""
    inventory = tmp_path / "inv.yaml"
    inventory.write_text("all:\n  children:\n    hpc:\n      hosts:\n        hpc-login: {ansible_host: 127.0.0.9, "
                         "ansible_port: 1}\n      vars:\n        slurm_login: hpc-login\n")
    command = (["mpirun", "-np"] if "--dry-run" in args else ["mpirun", "-np", "2", "app"]) if "mpirun" in args \
        else ["true"]
    out = run_fleet("-i", str(inventory), "profile", "--partition", "gpu", *args, "--", *command)
    assert out.returncode == 2 and said in out.stderr and "unreachable" not in out.stderr, out.stderr


@pytest.mark.parametrize("args", [["--hosts", "localhost", "--docker=--privileged"],
                                  ["--partition", "gpu", "--apptainer", "--writable"],
                                  ["--partition", "gpu", "--container-image=-v/:/host"]])
def test_an_image_that_is_an_option_is_refused_before_anything(args):
    """--docker=--privileged was planned as a docker option."""
    out = run_fleet("profile", *args, "--", "true")
    assert out.returncode == 2 and "an image name, not an option" in out.stderr, out.stderr
