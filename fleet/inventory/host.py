"""One host of an inventory, and the errors of reading an inventory and of naming hosts in one.

The bottom of the inventory package: the model, the ad-hoc targets and the pattern matcher all
build on it, and it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import FleetError


class InventoryError(FleetError, ValueError):
    """A malformed inventory; ``str()`` reads ``file:line: what is wrong``."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where, self.message = where, message


class TargetError(FleetError, ValueError):
    """Targets on the command line that name nothing in the inventory."""


def _last_set(vars: dict[str, Any], *names: str) -> Any:
    """The value of the last of ``names`` that is set, as Ansible's ssh plugin picks among a
    variable and its aliases (``ansible_host`` then ``ansible_ssh_host``: the alias wins)."""
    value = None
    for name in names:
        if vars.get(name) is not None:
            value = vars[name]
    return value


@dataclass(frozen=True)
class Host:
    name: str
    vars: dict[str, Any]
    groups: tuple[str, ...]
    where: str  # file:line of the (first) definition
    # fleet's own names holding another role's shape: the site's, shown with the rest, never used
    unused: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return _last_set(self.vars, "ansible_host", "ansible_ssh_host") or self.name

    @property
    def port(self) -> int | None:
        port = _last_set(self.vars, "ansible_port", "ansible_ssh_port")
        # checked on loading: a number or a string of digits
        return None if port is None else int(port)

    @property
    def user(self) -> str | None:
        return _last_set(self.vars, "ansible_user", "ansible_ssh_user")

    @property
    def key_file(self) -> str | None:
        return _last_set(self.vars, "ansible_private_key_file", "ansible_ssh_private_key_file")

    @property
    def connection(self) -> str:
        return self.vars.get("ansible_connection") or "ssh"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "port": self.port, "user": self.user,
                "connection": self.connection, "groups": list(self.groups), "vars": self.all_vars}

    @property
    def all_vars(self) -> dict[str, Any]:
        """Every variable of the host, as ansible-inventory shows them, those
        fleet does not use too."""
        return {**self.vars, **self.unused}
