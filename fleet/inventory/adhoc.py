"""Hosts named on the command line that no inventory lists, as ``ssh`` and ``clush -w`` take them.

A target ``[user@]host[:port]`` (``host`` may be a range, ``gpu[01-04]``, or an IPv6 address
written ``[2001:db8::1]:2222``) becomes one host per name, named by the host part alone, as
Ansible names ``host:port``: that name becomes folders of the report store, so it must be one
safe path component. Everything else about reaching it (HostName, User, Port, keys, ProxyJump)
is ssh_config's, which the SSH transport reads for every host: a ``Host`` alias there works as
it does for ``ssh NAME``.

Every part is untrusted: the user and the port are checked here, the name by
:func:`fleet.safenames.component_problem`; a target that fails is a :class:`TargetError`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from .. import safenames
from ..hostlist import HostPatternError, expand
from .host import Host, TargetError

WHERE = "(command line)"

# What ssh and useradd accept in practice, domain accounts (user@domain, DOMAIN\user) included;
# never a leading '-', which a tool further on could read as an option.
_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@\\$-]{0,63}")
_BRACKETED_IPV6 = re.compile(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?")


@dataclass(frozen=True)
class Target:
    """One ad-hoc target, parsed: the user and port it asked for, and the names its
    host part stands for."""
    user: str | None
    names: tuple[str, ...]
    port: int | None


def is_connect_target(word: str) -> bool:
    """Whether one word of a target (no commas outside brackets) names a host to connect to:
    it has a user (``alice@gpu01``), a port (``gpu01:2222``, ``gpu[01-04]:2222``) or is an IPv6
    address. Ansible's reading of such a word matches no host, so no pattern is lost."""
    if word[:1] in "!&~":
        return False
    if "@" in word or _BRACKETED_IPV6.fullmatch(word) or _is_ipv6(word):
        return True
    outside = _outside_ranges(word)
    return (outside.count(":") == 1 and outside.rpartition(":")[2].isdigit()
            and word.rpartition(":")[2].isdigit())


def _outside_ranges(pattern: str) -> str:
    """The pattern without its bracketed ranges (``gx-[01:03]`` holds a colon that is no port)."""
    depth, kept = 0, []
    for ch in pattern:
        depth += (ch == "[") - (ch == "]")
        if depth == 0 and ch not in "[]":
            kept.append(ch)
    return "".join(kept)


def parse(pattern: str) -> Target:
    """``[user@]host[:port]`` as ssh reads it: the user is what comes before the last '@'."""
    user, at, rest = pattern.rpartition("@")
    if at:
        if not _USER.fullmatch(user):
            raise TargetError(f"bad user {user!r} in target {pattern!r}: letters, digits, '.', "
                              "'_', '-', '@', '\\' or '$', not starting with '-'")
    else:
        user = None
    if m := _BRACKETED_IPV6.fullmatch(rest):
        host, port_text = m[1], m[2]
        if not _is_ipv6(host):
            raise TargetError(f"{host!r} in target {pattern!r} is not an IPv6 address")
        names = [host]
    else:
        host, port_text = _split_port(rest, pattern)
        try:
            names = [host] if _is_ipv6(host) else expand(host)
        except HostPatternError as e:
            raise TargetError(str(e)) from None
    port = None
    if port_text is not None:
        port = int(port_text)
        if not 1 <= port <= 65535:
            raise TargetError(f"port {port_text} in target {pattern!r} is not between 1 and 65535")
    for name in names:
        if problem := safenames.component_problem(name, "host name"):
            raise TargetError(f"{problem} (from target {pattern!r})")
    return Target(user, tuple(names), port)


def _split_port(text: str, pattern: str) -> tuple[str, str | None]:
    """``host:port``; a colon inside a range's brackets is the range's, several colons outside
    them an IPv6 address without a port (which must then be written ``[address]:port``)."""
    outside = _outside_ranges(text)
    if outside.count(":") != 1:
        return text, None
    head, _, tail = text.rpartition(":")
    if not (tail.isascii() and tail.isdigit()):
        raise TargetError(f"bad port {tail!r} in target {pattern!r}: a number is needed after ':'")
    return head, tail


def _is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False


def hosts(target: Target, known: dict[str, Host]) -> list[Host]:
    """The hosts a target stands for. A name the inventory has keeps its variables, with the
    target's user and port in place of its own (as ``ssh user@alias`` overrides ssh_config's
    User), and is reached over SSH whatever its ``ansible_connection`` said."""
    out = []
    for name in target.names:
        base = known.get(name)
        vars: dict[str, Any] = dict(base.vars) if base else {"ansible_host": name}
        if base and (target.user or target.port):
            vars.pop("ansible_connection", None)
            for alias in ("ansible_ssh_user", "ansible_ssh_port"):
                # the alias wins over ansible_user: it must not hide the target's
                vars.pop(alias, None)
        if target.user:
            vars["ansible_user"] = target.user
        if target.port:
            vars["ansible_port"] = target.port
        out.append(Host(name, vars, base.groups if base else (), base.where if base else WHERE,
                        base.unused if base else {}))
    return out
