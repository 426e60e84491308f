"""Schedules' times and lines: cron expressions and --every against croniter's next firings, names
and values that must not become shell, a schedule installed into a stand-in crontab, and one that
the real cron fires."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from croniter import croniter

from fleet.nightly import schedule
from tests.conftest import REPO, fleet_json, run_fleet
from tests.harness.crontab import standin_crontab

T0 = datetime(2026, 11, 29, 13, 5)  # a Sunday


def fires(expr: str, after: datetime = T0, n: int = 3) -> list[datetime]:
    return schedule.next_times(schedule.ScheduleRecord.read({"cron": expr, "backend": "crontab"}), n,
                               after.timestamp())


@pytest.mark.parametrize("expr, expected", [
    ("0 2 * * *", [datetime(2026, 11, 30, 2), datetime(2026, 12, 1, 2), datetime(2026, 12, 2, 2)]),
    # day of month OR day of week: the 1st, and every Monday
    ("0 2 1 * 1", [datetime(2026, 11, 30, 2), datetime(2026, 12, 1, 2), datetime(2026, 12, 7, 2)]),
    ("@daily", [datetime(2026, 11, 30), datetime(2026, 12, 1), datetime(2026, 12, 2)]),
    ("@hourly", [datetime(2026, 11, 29, 14), datetime(2026, 11, 29, 15), datetime(2026, 11, 29, 16)]),
    ("30 9 * * MON-FRI", [datetime(2026, 11, 30, 9, 30), datetime(2026, 12, 1, 9, 30), datetime(2026, 12, 2, 9, 30)]),
    ("0 0 1 JAN,jul *", [datetime(2027, 1, 1), datetime(2027, 7, 1), datetime(2028, 1, 1)]),
    ("*/15 * * * 1-5", [datetime(2026, 11, 30, 0, 0), datetime(2026, 11, 30, 0, 15), datetime(2026, 11, 30, 0, 30)]),
])
def test_cron_expressions_fire_when_cron_would(expr, expected):
    assert fires(expr) == expected
    assert schedule.check_cron(expr)


@pytest.mark.parametrize("bad", ["0 2 * *", "61 * * * *", "0 2 * * FOO", "0 0 L * *", "0 0 * * 1#2",
                                 "0 0 0 * * *", "@reboot", "0 2 * * *\n* * * * * touch x"])
def test_what_cron_does_not_take_is_refused(bad):
    with pytest.raises(schedule.ScheduleError):
        schedule.check_cron(bad)


@pytest.mark.parametrize("every, line", [
    ("1m", "* * * * *"), ("15m", "*/15 * * * *"), ("30m", "*/30 * * * *"), ("1h", "0 * * * *"),
    ("6h", "0 */6 * * *"), ("12h", "0 */12 * * *"), ("1d", "0 0 * * *"), ("24h", "0 0 * * *"), ("120s", "*/2 * * * *"),
])
def test_every_becomes_a_cron_line_that_fires_exactly_that_often(every, line):
    seconds = schedule.every_seconds(every)
    assert schedule.every_cron(seconds) == line
    it = croniter(line, datetime(2026, 11, 29, 23, 59, 59))
    times = [it.get_next(datetime) for _ in range(60)]  # across midnight, month and hour ends
    assert {b - a for a, b in zip(times, times[1:])} == {timedelta(seconds=seconds)}


@pytest.mark.parametrize("every, nearest", [("90s", "--every 2m"), ("7h", "--every 8h"), ("45s", "--every 1m"),
                                            ("2d", "--every 1d"), ("7m", "--every 6m"), ("25h", "--every 1d")])
def test_every_cron_cannot_repeat_is_refused_with_the_nearest(every, nearest):
    with pytest.raises(schedule.ScheduleError, match=f"nearest it can is {nearest} ") as e:
        schedule.every_cron(schedule.every_seconds(every))
    assert "\n" not in str(e.value)


def test_the_resubmitting_job_keeps_the_exact_interval():
    record = schedule.ScheduleRecord.read({"cron": None, "every": 90, "backend": "resubmit",
                                           "installed_ts": T0.timestamp()})
    assert schedule.next_begin(record) == "now+90"
    assert schedule.next_times(record, 3, T0.timestamp() + 100) == [T0 + timedelta(seconds=s) for s in (180, 270, 360)]


@pytest.mark.parametrize("name", ["nightly; touch x #", "a\nb", "$(touch x)", "../x", ".hidden", "-x", "", "a b",
                                  "x" * 65, "a'b"])
def test_names_that_are_not_one_safe_word_are_refused(name):
    with pytest.raises(schedule.ScheduleError, match="schedule name"):
        schedule.check_name(name)


ODD = "/tmp/st ore 'q' \"dq\" $(touch pwned) `touch pwned2` 50% x;y"


def test_a_crontab_line_runs_exactly_the_words_given(tmp_path):
    """Every value is one shell word: sh, after cron's % handling, runs exactly those arguments."""
    dump = tmp_path / "argv-dump"
    dump.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"json.dump([sys.argv[1:], os.environ['FLEET_STORE']], open({str(tmp_path / 'argv.json')!r}, 'w'))\n")
    dump.chmod(0o755)
    record = {"name": "nightly-1.x_y", "cron": None, "every": 21600, "backend": "crontab", "python": str(dump),
              "env": {"FLEET_STORE": ODD, "HOME": "/root"}, "dir": str(tmp_path / "l o g%s"), "playbook": "/p.yaml"}
    line = schedule.crontab_line(schedule.ScheduleRecord.read(record))
    assert line.count("\n") == 1 and line.startswith("0 */6 * * * ")
    command = line.split(None, 5)[5].replace("\\%", "%")  # what cron hands to sh
    words = shlex.split(command, comments=True)
    assert words == [f"FLEET_STORE={ODD}", "HOME=/root", str(dump), "-m", "fleet", "schedule", "fire",
                     "nightly-1.x_y", ">>", str(tmp_path / "l o g%s" / "nightly-1.x_y.log"), "2>&1"]
    (tmp_path / "l o g%s").mkdir()
    subprocess.run(["sh", "-c", command], cwd=tmp_path, check=True)
    assert json.loads((tmp_path / "argv.json").read_text()) == [["-m", "fleet", "schedule", "fire", "nightly-1.x_y"],
                                                                ODD]
    assert not list(tmp_path.glob("pwned*"))
    for bad in ({"env": {"FLEET_STORE": "/s\n* * * * * touch x"}}, {"dir": "/s\nx"}, {"python": "/p\rx"}):
        with pytest.raises(schedule.ScheduleError, match="newline"):
            schedule.crontab_line(schedule.ScheduleRecord.read({**record, **bad}))
    with pytest.raises(schedule.ScheduleError, match="newline"):
        schedule.batch_script(schedule.ScheduleRecord.read({**record, "playbook": "/p\n#SBATCH --x"}))


def lab_playbook(tmp_path: Path, name: str) -> Path:
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": name, "target": {"hosts": "h01"}, "command": ["true"]}))
    return pb


def test_a_crontab_schedule_fires_at_the_asked_times_and_runs_the_asked_command(tmp_path):
    bin_dir, table = standin_crontab(tmp_path)
    table.write_text("5 4 * * * /usr/bin/backup  # someone else's\n")
    store_dir = tmp_path / "st ore 'q' $(touch pwned) 50%"
    env = {"FLEET_STORE": str(store_dir), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    r = run_fleet("schedule", "install", str(lab_playbook(tmp_path, "nightly")), "--every", "6h",
                  "--backend", "crontab", env=env)
    assert r.returncode == 0, r.stderr
    assert "every 6h, cron '0 */6 * * *'" in r.stdout and "next: " in r.stdout
    lines = table.read_text().splitlines()
    assert lines[0] == "5 4 * * * /usr/bin/backup  # someone else's" and len(lines) == 2
    expr, command = " ".join(lines[1].split(None, 5)[:5]), lines[1].split(None, 5)[5]
    times = fires(expr, datetime(2026, 11, 29, 13, 5), 4)
    assert times == [datetime(2026, 11, 29, 18), datetime(2026, 11, 30), datetime(2026, 11, 30, 6),
                     datetime(2026, 11, 30, 12)]
    words = shlex.split(command.replace("\\%", "%"), comments=True)
    at = words.index(sys.executable)
    assert words[at:] == [sys.executable, "-m", "fleet", "schedule", "fire", "nightly", ">>",
                          str(store_dir / "schedules" / "nightly.log"), "2>&1"]
    assert f"FLEET_STORE={store_dir}" in words[:at]
    ls = fleet_json(run_fleet("schedule", "ls", "--json", env=env).stdout)["schedules"]
    assert len(ls) == 1 and len(ls[0]["next"]) == 3
    assert [datetime.fromisoformat(t).hour % 6 for t in ls[0]["next"]] == [0, 0, 0]
    assert "next " in run_fleet("schedule", "ls", env=env).stdout
    rm = run_fleet("schedule", "rm", "nightly", env=env)
    assert rm.returncode == 0, rm.stderr
    assert table.read_text() == "5 4 * * * /usr/bin/backup  # someone else's\n"
    assert not list(tmp_path.rglob("pwned"))


@pytest.mark.parametrize("name", ["nightly; touch x #", "a\n* * * * * touch x", "$(touch x)"])
def test_an_unsafe_playbook_name_is_refused_and_nothing_is_installed(tmp_path, name):
    bin_dir, table = standin_crontab(tmp_path)
    env = {"FLEET_STORE": str(tmp_path / "store"), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    r = run_fleet("schedule", "install", str(lab_playbook(tmp_path, name)), "--cron", "@daily",
                  "--backend", "crontab", env=env)
    # Refused where the playbook is read, before a schedule is made of it (the schedule refuses it too).
    assert r.returncode == 2 and r.stderr.startswith("fleet: ") and r.stderr.count("\n") == 1, r.stderr
    assert "must be 1 to 64 letters" in r.stderr or "a schedule name is" in r.stderr
    assert not table.exists() and not list((tmp_path / "store").rglob("*.json"))


def test_an_unsafe_schedule_name_given_with_name_is_refused_too(tmp_path):
    bin_dir, table = standin_crontab(tmp_path)
    env = {"FLEET_STORE": str(tmp_path / "store"), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    r = run_fleet("schedule", "install", str(lab_playbook(tmp_path, "nightly")), "--name", "x; touch y #",
                  "--cron", "@daily", "--backend", "crontab", env=env)
    assert r.returncode == 2 and r.stderr.startswith("fleet: a schedule name is") and r.stderr.count("\n") == 1
    assert not table.exists() and not list((tmp_path / "store").rglob("*.json"))


def test_without_crontab_install_and_rm_say_so_in_one_line_and_record_nothing(tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = {"FLEET_STORE": str(tmp_path / "store"), "PATH": str(empty)}
    pb = lab_playbook(tmp_path, "nightly")
    r = run_fleet("schedule", "install", str(pb), "--cron", "0 2 * * *", "--backend", "crontab", env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "needs crontab" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not list((tmp_path / "store").rglob("*.json"))
    for backend, tool in (("resubmit", "sbatch"), ("scrontab", "scrontab")):
        r = run_fleet("schedule", "install", str(pb), "--every", "1h", "--backend", backend, env=env)
        assert r.returncode == 2 and f"needs {tool}" in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert not list((tmp_path / "store").rglob("nightly.*"))
    # A schedule installed where crontab was, removed where it is not: said, and kept.
    bin_dir, _ = standin_crontab(tmp_path)
    assert run_fleet("schedule", "install", str(pb), "--cron", "0 2 * * *", "--backend", "crontab",
                     env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin"}).returncode == 0
    rm = run_fleet("schedule", "rm", "nightly", env=env)
    assert rm.returncode == 2 and "needs crontab" in rm.stderr and rm.stderr.count("\n") == 1, rm.stderr
    assert (tmp_path / "store" / "schedules" / "nightly.json").exists()
    refused = run_fleet("schedule", "install", str(pb), "--every", "90s", "--backend", "crontab", env=env)
    assert refused.returncode == 2 and "nearest it can is --every 2m" in refused.stderr


def test_dry_run_says_the_line_it_would_add_and_installs_nothing(tmp_path):
    bin_dir, table = standin_crontab(tmp_path)
    store_dir = tmp_path / "store"
    env = {"FLEET_STORE": str(store_dir), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    pb = lab_playbook(tmp_path, "nightly")
    r = run_fleet("schedule", "install", str(pb), "--every", "6h", "--backend", "crontab", "--dry-run", env=env)
    assert r.returncode == 0, r.stderr
    said, line, nxt = r.stdout.splitlines()
    assert said == "would schedule nightly (every 6h, cron '0 */6 * * *') with crontab, adding to your crontab:"
    assert line.startswith("0 */6 * * * ") and line.endswith("# fleet-schedule:nightly") and nxt.startswith("next: ")
    doc = fleet_json(run_fleet("schedule", "install", str(pb), "--cron", "@daily", "--backend", "crontab",
                               "--dry-run", "--json", env=env).stdout, "schedule install")
    assert doc["dry_run"] and doc["would_install"].startswith("@daily ") and len(doc["next"]) == 3
    assert not table.exists() and not store_dir.exists()  # no crontab edited, no record, no folder
    # What a real install would refuse, a dry run refuses the same way.
    refused = run_fleet("schedule", "install", str(pb), "--every", "90s", "--backend", "crontab", "--dry-run", env=env)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and not store_dir.exists()
    # Then installed for real, the line is the one the dry run showed.
    assert run_fleet("schedule", "install", str(pb), "--every", "6h", "--backend", "crontab", env=env).returncode == 0
    assert table.read_text().splitlines() == [line]
    assert run_fleet("schedule", "rm", "nightly", env=env).returncode == 0


CRON = shutil.which("cron") or "/usr/sbin/cron"


def test_real_cron_takes_the_line_and_fires_it_into_a_run(tmp_path):
    """Debian's own crontab(1) checks the line as cron reads it, and cron itself fires it: a whole
    `fleet run` of the playbook, catalogued. Inside a private mount namespace whose crontab spool,
    /etc/cron.d, /etc/crontab and /run are empty tmpfs: the machine's tables and any cron of its
    own are neither seen nor touched, and the namespace ends with the script."""
    assert Path(CRON).exists() and shutil.which("crontab"), "cron is not installed: scripts/test installs it"
    store_dir = tmp_path / "st ore 50%"
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"here": {
        "ansible_connection": "local", "report_dir": str(tmp_path / "runs"),
        "nsys_path": str(REPO / "tests" / "standins" / "nsys")}}}}))
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "every-minute", "target": {"hosts": "here"}, "command": ["true"],
                                  "metrics": [{"kind": "gpu_kernel_total"}]}))
    (tmp_path / "empty").write_text("")
    fleet = f"{shlex.quote(sys.executable)} -m fleet -i {shlex.quote(str(inventory))}"
    script = f"""set -u
cd {shlex.quote(str(tmp_path))}
mount -t tmpfs -o mode=1730,gid=$(getent group crontab | cut -d: -f3) tmpfs /var/spool/cron/crontabs
mount -t tmpfs tmpfs /etc/cron.d && mount --bind empty /etc/crontab && mount -t tmpfs tmpfs /run
echo '5 4 * * * /usr/bin/backup  # someone else' | crontab - || exit 10
{fleet} schedule install {shlex.quote(str(pb))} --every 1m --backend crontab > install.txt 2>&1 || exit 11
crontab -l > installed.txt
{CRON} -f -L 15 > cron.log 2>&1 & cron=$!
for _ in $(seq 1 150); do grep -qs 'run .* complete' {shlex.quote(str(store_dir))}/schedules/every-minute.log && break; sleep 1; done
kill $cron; wait $cron
{fleet} schedule rm every-minute > rm.txt 2>&1 || exit 12
crontab -l > after.txt
"""
    env = {**os.environ, "FLEET_STORE": str(store_dir)}
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script], env=env,
                          capture_output=True, text=True, timeout=240)
    said = {f: (tmp_path / f).read_text() for f in ("install.txt", "installed.txt", "cron.log", "rm.txt", "after.txt")
            if (tmp_path / f).exists()}
    assert done.returncode == 0, (done.returncode, done.stderr, said)
    assert "every 1m, cron '* * * * *'" in said["install.txt"]
    lines = said["installed.txt"].splitlines()
    assert lines[0] == "5 4 * * * /usr/bin/backup  # someone else" and lines[1].startswith("* * * * * ")
    log = (store_dir / "schedules" / "every-minute.log").read_text()
    assert re.search(r"schedule every-minute: run \d{8}-\d{6}-\w{4} complete", log), (log, said["cron.log"])
    [run_id] = re.findall(r"run (\d{8}-\d{6}-\w{4}) complete", log)[:1]
    assert run_id in run_fleet("reports", "ls", env={"FLEET_STORE": str(store_dir)}).stdout
    assert said["after.txt"] == "5 4 * * * /usr/bin/backup  # someone else\n"
