"""One error base (fleet/errors.py) and one handler (fleet/cli/main.py): an error a user can act on
ends a command with one line, ``fleet: ...``, and its exit status, never a traceback."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import fleet
from fleet import exitcodes
from fleet.errors import FleetError
from tests.conftest import run_fleet

# What travels to the nodes has no fleet installed there, so no FleetError: the agent, and the
# modules shipped with it (fleet/agent/bundle.py).
SHIPPED_PREFIXES = ("fleet.agent", "fleet.policy", "fleet.plan", "fleet.safenames")
# Errors that never reach a user as such: each is turned into another (a host's result, a
# TargetError with its file:line) where it is caught.
INTERNAL = {
    "fleet.hostlist.HostPatternError", "fleet.hostlist.TooManyNames",  # -> InventoryError, TargetError
    "fleet.transport.connect_errors.SilentServer", "fleet.transport.connect_errors.KeyProblem",
    "fleet.transport.connect_errors.JumpFailed",  # -> a host's unreachable result
    "fleet.transport.compressed.Stalled",  # -> the copy's "stalled", said by the fetch
}
# Modules other work is changing now, whose errors are to take the base there; then removed from
# here (the list is to end empty).
NOT_YET_ON_THE_BASE: set = set()


def controller_errors() -> dict[str, type]:
    """Every exception class the controller's modules define, by its full name."""
    found = {}
    for info in pkgutil.walk_packages(fleet.__path__, "fleet."):
        if info.name.startswith(SHIPPED_PREFIXES) or info.name == "fleet.__main__":
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name:
                found[f"{info.name}.{name}"] = value
    return found


def test_every_error_of_the_controller_derives_from_the_one_base():
    errors = controller_errors()
    assert "fleet.inventory.host.InventoryError" in errors and "fleet.nightly.schedule.ScheduleError" in errors
    wrong = [name for name, cls in errors.items()
             if not issubclass(cls, FleetError) and name not in INTERNAL | NOT_YET_ON_THE_BASE]
    assert wrong == []
    assert [n for n in NOT_YET_ON_THE_BASE if n in errors and issubclass(errors[n], FleetError)] == [], \
        "on the base now: remove from NOT_YET_ON_THE_BASE"


def test_an_error_keeps_the_builtin_it_always_was():
    from fleet.inventory import InventoryError, TargetError
    from fleet.nightly.playbook import PlaybookError

    assert issubclass(InventoryError, ValueError) and issubclass(TargetError, ValueError)
    assert not issubclass(PlaybookError, InventoryError)  # no hierarchy bent to reach a handler
    assert str(PlaybookError("p.yaml:3", "command must be a list")) == "p.yaml:3: command must be a list"


def one_line(out) -> str:
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleet: ") and "Traceback" not in out.stderr, out.stderr
    return lines[0]


@pytest.mark.parametrize("args, says, touches_store", [
    (("schedule", "rm", "no-such-schedule"), "no-such-schedule", True),  # the store is made to look in it
    (("run", "PLAYBOOK"), "PLAYBOOK:1: a playbook is a mapping", False),
])
def test_the_cli_turns_a_fleet_error_into_its_line_and_status(tmp_path, args, says, touches_store):
    playbook = tmp_path / "bad.yaml"
    playbook.write_text("- just a list\n")
    store = tmp_path / "store"
    args = tuple(str(playbook) if a == "PLAYBOOK" else a for a in args)
    out = run_fleet(*args, "--store", str(store))
    assert out.returncode == exitcodes.USAGE, out.stderr
    assert says.replace("PLAYBOOK", str(playbook)) in one_line(out)
    assert store.exists() == touches_store
