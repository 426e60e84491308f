"""How a host is reached, from Ansible's ssh arguments in the inventory, read as OpenSSH reads them.

``ansible_ssh_args``, then ``ansible_port``/``ansible_user``/the key, then
``ansible_ssh_common_args``, then ``ansible_ssh_extra_args``: the order in which Ansible's ssh
plugin puts them on ssh's command line, where the first value of an option wins. Each is split
as a shell splits it. What fleet's SSH stack (asyncssh) can do as ssh does is honoured; an option
it cannot honour is refused, naming the host, the variable and the option: never ignored. The
table in docs/inventory.md lists each.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import FleetError

if TYPE_CHECKING:
    from .host import Host

ARG_VARIABLES = ("ansible_ssh_args", "ansible_ssh_common_args", "ansible_ssh_extra_args")

# ssh_config keywords honoured, by their lower-case spelling.
HONOURED = {k.lower(): k for k in (
    "Port", "User", "IdentityFile", "IdentitiesOnly", "IdentityAgent", "ConnectTimeout",
    "ProxyJump",
    "ProxyCommand", "ServerAliveInterval", "ServerAliveCountMax", "ForwardAgent", "Compression",
    "TCPKeepAlive")}
# Options whose purpose fleet serves by itself; what they ask for is done.
SERVED = {
    "controlmaster": "fleet keeps one connection per host for the whole run",
    "controlpersist": "fleet keeps one connection per host for the whole run",
    "controlpath": "fleet keeps one connection per host for the whole run",
    "batchmode": "fleet never prompts",
    "stricthostkeychecking": "fleet always checks host keys strictly",
    "loglevel": "fleet prints no ssh diagnostics",
}
_SERVED_ONLY = {"batchmode": "yes", "stricthostkeychecking": "yes"}  # the other values are refused
_FLAGS = {"C": ("Compression", "yes"), "A": ("ForwardAgent", "yes"), "a": ("ForwardAgent", "no")}
_FLAGS_SERVED = {"q": "fleet prints no ssh diagnostics", "T": "fleet never asks for a terminal",
                 "x": "fleet forwards no X11"}
_WITH_VALUE = {"p": "Port", "l": "User", "i": "IdentityFile", "J": "ProxyJump", "o": None}
_OTHER_WITH_VALUE = set("bcDEeFIiLmOQRSWwB") - set(_WITH_VALUE)


class ConnectionOptionError(FleetError, ValueError):
    """An ssh argument of the inventory that fleet cannot honour; the message names all."""


@dataclass(frozen=True)
class SSHArgs:
    """The options a host's ssh arguments set, first value winning; IdentityFile accumulates."""
    options: dict[str, str] = field(default_factory=dict)
    identity_files: tuple[str, ...] = ()
    served: tuple[str, ...] = ()  # options fleet serves by itself, as given

    @property
    def jumps(self) -> list[str]:
        value = self.options.get("ProxyJump", "none")
        return [] if value.lower() == "none" else [j.strip() for j in value.split(",") if j.strip()]

    @property
    def proxy_command(self) -> str | None:
        value = self.options.get("ProxyCommand")
        return None if value is None or value.lower() == "none" else value


def ssh_args(host: "Host") -> SSHArgs:
    """The host's ssh arguments, checked; raises :class:`ConnectionOptionError`."""
    options: dict[str, str] = {}
    keys: list[str] = []
    served: list[str] = []

    def put(name: str, value: str, variable: str, shown: str) -> None:
        key = name.lower()
        if key in SERVED:
            if key in _SERVED_ONLY and value.lower() != _SERVED_ONLY[key]:
                raise ConnectionOptionError(_refusal(host, variable, shown,
                                                     "fleet cannot honour this value"))
            served.append(shown)
        elif key not in HONOURED:
            raise ConnectionOptionError(_refusal(host, variable, shown,
                                                 "fleet cannot honour this option"))
        elif key == "identityfile":
            keys.append(value)
        else:
            options.setdefault(HONOURED[key], value)

    for variable in ARG_VARIABLES[:1]:
        _read(host, variable, put)
    # Ansible puts these between ssh_args and the common args (its ssh plugin's _build_command)
    if host.port:
        options.setdefault("Port", str(host.port))
    if host.user:
        options.setdefault("User", host.user)
    if host.key_file:
        keys.append(host.key_file)
    for variable in ARG_VARIABLES[1:]:
        _read(host, variable, put)
    return SSHArgs(options, tuple(keys), tuple(served))


def _read(host: "Host", variable: str, put) -> None:
    words = _words(host, variable)
    i = 0
    while i < len(words):
        i = _read_option(host, variable, words, i, put) + 1


def _words(host: "Host", variable: str) -> list[str]:
    """The variable's ssh arguments split as a shell splits them; none when it is unset or empty."""
    text = host.vars.get(variable)
    if text is None or text == "":
        return []
    if not isinstance(text, str):
        raise ConnectionOptionError(f"{host.name}: {variable} must be a string of ssh arguments, "
                                    f"not {type(text).__name__}")
    try:
        return shlex.split(text)
    except ValueError as e:
        raise ConnectionOptionError(f"{host.name}: {variable} cannot be split as a "
                                    f"shell splits it: {e}") from None


def _read_option(host: "Host", variable: str, words: list[str], i: int, put) -> int:
    """The options of ``words[i]`` (bundled flags: -Cq, -p2222, -oPort=22), and the value the last
    of them takes; the index of the last word read."""
    word = words[i]
    if not word.startswith("-") or len(word) < 2:
        raise ConnectionOptionError(_refusal(host, variable, word,
                                             "ssh arguments are options, not a host "
                                             "or a command"))
    for j in range(1, len(word)):
        flag = word[j]
        if flag in _WITH_VALUE or flag in _OTHER_WITH_VALUE:
            value = word[j + 1:]
            if not value:
                i += 1
                if i == len(words):
                    raise ConnectionOptionError(_refusal(host, variable, f"-{flag}",
                                                         "a value is missing"))
                value = words[i]
            _put_with_value(host, variable, flag, value, put)
            break
        if flag in _FLAGS:
            put(*_FLAGS[flag], variable, f"-{flag}")
        elif flag not in _FLAGS_SERVED:
            raise ConnectionOptionError(_refusal(host, variable, f"-{flag}",
                                                 "fleet cannot honour this option"))
    return i


def _put_with_value(host: "Host", variable: str, flag: str, value: str, put) -> None:
    """An option that takes a value: ``-o Name=value``, one ssh names (``-p``), or one refused."""
    if flag == "o":
        name, _, rest = value.replace("=", " ", 1).partition(" ")
        put(name, rest.strip(), variable, f"-o {value}")
    elif flag in _WITH_VALUE:
        put(_WITH_VALUE[flag], value, variable, f"-{flag} {value}")
    else:
        raise ConnectionOptionError(_refusal(host, variable, f"-{flag} {value}",
                                             "fleet cannot honour this option"))


def _refusal(host: "Host", variable: str, shown: str, why: str) -> str:
    return (f"{host.name}: {shown!r} in {variable}: {why} (docs/inventory.md lists what fleet "
            "honours); nothing was run there")


def describe(host: "Host", resolved: dict[str, Any]) -> str:
    """One line: how fleet reaches the host (``resolved``: user, port, keys, jumps, proxy)."""
    if host.connection == "local":
        return f"{host.name}: this machine, without SSH"
    user = f"{resolved['user']}@" if resolved.get("user") else ""
    line = f"{host.name}: ssh {user}{host.address}:{resolved.get('port') or 22}"
    keys = resolved.get("keys") or []
    line += f", key {', '.join(keys)}" if keys else ", keys from ssh-agent and ssh's defaults"
    if resolved.get("jumps"):
        line += f", through {' then '.join(resolved['jumps'])}"
    if resolved.get("proxy_command"):
        line += f", through the command {resolved['proxy_command']!r}"
    return line


def host_port(text: str) -> tuple[str, int | None]:
    """``host``, ``host:port`` or ``[address]:port`` of a ProxyJump hop."""
    if text.startswith("[") and "]:" in text:
        name, _, port = text[1:].partition("]:")
    elif text.count(":") == 1:
        name, _, port = text.partition(":")
    else:
        return text, None
    return name, int(port) if port.isdigit() else None


def number(value: str, name: str, host: "Host") -> int:
    try:
        return int(value)
    except ValueError:
        raise ConnectionOptionError(f"{host.name}: {name} {value!r} in its ssh "
                                    "arguments is not a number") from None


def yes_no(value: str, name: str, host: "Host") -> bool:
    if value.lower() in ("yes", "no"):
        return value.lower() == "yes"
    raise ConnectionOptionError(f"{host.name}: {name} {value!r} in its ssh "
                                "arguments: yes or no is needed")


def expand_proxy_command(command: str, host: "Host", opts: dict[str, Any], local_user: str) -> str:
    """ProxyCommand's %h, %p, %r, %n and %% as ssh expands them, each value quoted for the shell."""
    values = {"h": host.address, "n": host.address, "p": str(opts.get("port") or host.port or 22),
              "r": opts.get("username") or host.user or local_user, "%": "%"}

    def one(m) -> str:
        if m[1] not in values:
            raise ConnectionOptionError(f"{host.name}: %{m[1]} in ProxyCommand: "
                                        "fleet expands %h, %p, %r, %n, %%")
        return values[m[1]] if m[1] in "%p" else shlex.quote(values[m[1]])

    return re.sub(r"%(.)", one, command)


def agent_for_keys(given: dict):
    """The ssh-agent that may hold an encrypted key named for the host: IdentityAgent's, else
    SSH_AUTH_SOCK's (``()``); IdentitiesOnly limits which keys are offered, not where they are."""
    agent = given.get("IdentityAgent")
    if agent is None:
        return ()
    return None if agent.lower() == "none" else os.path.expanduser(agent)


def route(host: "Host", config_paths: list[str], local_user: str) -> dict[str, Any]:
    """How the host will be reached, the inventory's ssh arguments over ssh_config's: user, port,
    keys, jump hosts, proxy command; raises :class:`ConnectionOptionError` as ``ssh_args`` does."""
    from asyncssh.config import SSHClientConfig

    args = ssh_args(host)
    given = args.options
    port = number(given["Port"], "Port", host) if "Port" in given else None
    config = SSHClientConfig.load(None, config_paths, False, False, False, local_user,
                                  given.get("User") or (), host.address, port or ())
    return {"user": given.get("User") or config.get("User") or local_user, "port": port
            or config.get("Port") or 22,
            "keys": list(args.identity_files) or [str(k) for k in config.get("IdentityFile", ())],
            "jumps": _jumps(args, config), "proxy_command": _proxy_command(args, config)}


def _jumps(args: SSHArgs, config) -> list[str]:
    """The jump hosts: the inventory's ProxyJump, else ssh_config's."""
    return args.jumps or [j for j in str(config.get("ProxyJump") or "none").split(",")
                          if j.lower() != "none"]


def _proxy_command(args: SSHArgs, config) -> str | None:
    """The proxy command: the inventory's, else ssh_config's (a list in some asyncssh versions)."""
    proxy = args.proxy_command or config.get("ProxyCommand")
    return " ".join(proxy) if isinstance(proxy, (list, tuple)) else proxy
