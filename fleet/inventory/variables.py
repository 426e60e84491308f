"""The variables fleet reads, their checks, and the Ansible variables that are never typos.

Every value reaches fleet from an untrusted file, so each of fleet's own variables is
checked wherever it is set (a group's vars, a host line, a vars file, a listing). Merging
only replaces whole values, so every merged value has been checked where it was set.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Callable

from .host import InventoryError


def _str(v: Any) -> str | None:
    return None if isinstance(v, str) and v.strip() else "a non-empty string is needed"


def _port(v: Any) -> str | None:
    # Ansible's ssh plugin takes a port as an integer or as digits ('2222' quoted in INI).
    if isinstance(v, str) and v.isascii() and v.isdigit():
        v = int(v)
    ok = isinstance(v, int) and not isinstance(v, bool) and 0 < v < 65536
    return None if ok else "a port number between 1 and 65535 is needed"


def _connection(v: Any) -> str | None:
    return None if v in ("ssh", "local") else "fleet reaches hosts by 'ssh' or 'local'"


def _bool(v: Any) -> str | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, str):  # INI reads `x=true` as the string 'true', and so does Ansible
        return f"true or false is needed, not the string {v!r} (in an INI file write True or False)"
    return "true or false is needed"


_SYSCTL_NAME = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_-]+)+$")


def _sysctls(v: Any) -> str | None:
    if not isinstance(v, dict):
        return "a mapping of sysctl name to the value fleet may set is needed"
    for name, value in v.items():
        if not isinstance(name, str) or not _SYSCTL_NAME.match(name):
            return f"{name!r} is not a sysctl name (like kernel.perf_event_paranoid)"
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            return f"the value for {name} must be a number or a string"
    return None


def _str_list(v: Any) -> str | None:
    ok = isinstance(v, list) and v and all(isinstance(x, str) and x for x in v)
    return None if ok else "a list of names is needed"


def _password(v: Any) -> str | None:
    return "passwords do not belong in an inventory: use keys or an ssh agent"


def _key_text(v: Any) -> str | None:
    return ("private keys do not belong in an inventory: name a key file "
            "(ansible_ssh_private_key_file) or use an ssh agent")


VARIABLES: dict[str, tuple[Callable[[Any], str | None], str]] = {
    "ansible_host": (_str, "address to connect to (default: the host's name)"),
    "ansible_port": (_port, "SSH port"),
    "ansible_user": (_str, "SSH user"),
    "ansible_connection": (_connection, "'ssh' (default) or 'local'"),
    "ansible_python_interpreter": (_str, "python3 on the node that runs fleet's agent"),
    "ansible_ssh_private_key_file": (_str, "private key for this host"),
    # Aliases Ansible still honours; where both are set the alias wins, as in Ansible's ssh plugin.
    "ansible_ssh_host": (_str, "alias of ansible_host"),
    "ansible_ssh_port": (_port, "alias of ansible_port"),
    "ansible_ssh_user": (_str, "alias of ansible_user"),
    "ansible_private_key_file": (_str, "alias of ansible_ssh_private_key_file"),
    "ansible_password": (_password, ""),
    "ansible_ssh_pass": (_password, ""),
    "ansible_ssh_password": (_password, ""),
    "ansible_become_pass": (_password, ""),
    "ansible_become_password": (_password, ""),
    "ansible_sudo_pass": (_password, ""),
    "ansible_su_pass": (_password, ""),
    "ansible_paramiko_pass": (_password, ""),
    "ansible_paramiko_password": (_password, ""),
    "ansible_private_key": (_key_text, ""),
    "ansible_ssh_private_key": (_key_text, ""),
    "nsys_path": (_str, "nsys executable on the node, when it is not found by itself"),
    "ncu_path": (_str, "ncu executable on the node, when it is not found by itself"),
    "report_dir": (_str, "directory on the node where profilers write reports"),
    "owned_sysctls": (_sysctls, "sysctls fleet may set on this node, with the value to set"),
    "shared_report_dir": (_str,
                          "label of a report directory several nodes share (NFS): read through one "
                          "of them"),
    "remove_gathered_reports": (_bool,
                                "delete a report on the node once its copy in the store is "
                                "verified"),
    "docker_seccomp_profile": (_str, "seccomp profile on the node that allows perf_event_open "
                                     "(CPU sampling in Docker)"),
    "slurm_login": (_str, "login host of the Slurm cluster this group describes"),
    "slurm_partitions": (_str_list, "partitions of that cluster fleet may submit to"),
    "slurm_scratch": (_str,
                      "node-local directory the ranks write reports to (copied to the run "
                      "directory)"),
}

# Variables Ansible's connection, become and shell plugins read: fleet keeps them without using
# them, and a name among them is never taken for a typo of one of fleet's own
# (tests/test_inventory_ansible.py checks this list against the plugins of ansible-core).
ANSIBLE_VARIABLES = frozenset("""
    ansible_become ansible_become_exe ansible_become_flags ansible_become_method ansible_become_user
    ansible_connection_timeout ansible_control_path ansible_control_path_dir ansible_group_priority
    ansible_host_key_checking ansible_network_os ansible_pipelining ansible_remote_tmp
    ansible_scp_extra_args ansible_scp_if_ssh ansible_sftp_batch_mode ansible_sftp_extra_args
    ansible_shell_executable ansible_shell_type ansible_ssh_args ansible_ssh_common_args
    ansible_ssh_executable ansible_ssh_extra_args ansible_ssh_host_key_checking
    ansible_ssh_pipelining ansible_ssh_retries ansible_ssh_timeout ansible_ssh_transfer_method
    ansible_timeout ansible_su_exe ansible_su_flags ansible_su_user ansible_sudo_exe
    ansible_sudo_flags ansible_sudo_user ansible_async_dir ansible_keep_remote_files
    ansible_module_compression ansible_ssh_use_tty ansible_ssh_password_mechanism
    ansible_paramiko_pty ansible_paramiko_host_key_checking ansible_paramiko_look_for_keys
    ansible_paramiko_proxy_command ansible_paramiko_record_host_keys
    ansible_paramiko_use_rsa_sha2_algorithms ansible_ssh_verbosity
    ansible_ssh_private_key_passphrase ansible_private_key_passphrase ansible_system_tmpdirs
    ansible_local_become_strip_preamble ansible_local_become_success_timeout ansible_paramiko_host
    ansible_paramiko_port ansible_paramiko_user ansible_paramiko_private_key_file
    ansible_paramiko_timeout ansible_scp_executable ansible_sftp_executable
    ansible_ssh_pkcs11_provider ansible_sshpass_prompt ansible_su_prompt_l10n ansible_sudo_chdir
""".split())

_TEMPLATE = re.compile(r"\{\{|\{%")


def _vaulted(value: Any) -> bool:
    """A value Ansible encrypted (``!vault``), as ansible-inventory writes it in JSON."""
    if isinstance(value, dict):
        return "__ansible_vault" in value or any(_vaulted(v) for v in value.values())
    if isinstance(value, list):
        return any(_vaulted(v) for v in value)
    return False


# fleet's own variables that are not Ansible's: another role of a site may use the same name for
# something else (galaxyproject.slurm's slurm_partitions is a list of hashes). A value of another
# shape is the site's, kept and shown, but not used by fleet, with a warning.
_SHAPES: dict[str, Callable[[Any], bool]] = {
    **dict.fromkeys(("nsys_path", "ncu_path", "report_dir", "shared_report_dir",
                     "docker_seccomp_profile",
                     "slurm_login", "slurm_scratch"), lambda v: isinstance(v, str)),
    "owned_sysctls": lambda v: isinstance(v, dict),
    "slurm_partitions": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    # a string of true or false is evidently meant for fleet: its error says how to write it
    "remove_gathered_reports": lambda v: isinstance(v, bool) or str(v).lower() in ("true", "false",
                                                                                   "yes", "no"),
}


def usable(key: str, value: Any) -> bool:
    """Whether fleet uses this value: not when one of its own names holds another role's shape."""
    return key not in _SHAPES or _SHAPES[key](value)


def _one_edit(a: str, b: str) -> bool:
    """One insertion, deletion, substitution or swap of neighbours apart."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def check_variable(key: Any, value: Any, where: str) -> str | None:
    """Raise :class:`InventoryError` at ``where`` for a bad name or a bad value of fleet's own;
    return a warning for a value fleet will not use, or a name that looks like a typo of one."""
    if not isinstance(key, str) or not key:
        raise InventoryError(where, f"bad variable name {key!r}")
    if _vaulted(value):
        raise InventoryError(where,
                             f"{key}: a vault-encrypted value; fleet does not decrypt Ansible "
                             "Vault "
                                    "(see 'What fleet leaves out' in docs/inventory.md)")
    if key in VARIABLES:
        return _check_own(key, value, where)
    if key not in ANSIBLE_VARIABLES:
        return _check_unknown(key, value, where)
    return None


def _check_own(key: str, value: Any, where: str) -> str | None:
    """A value of one of fleet's variables: refused when bad, unless it has another role's shape
    (then a warning); a Jinja template is refused too."""
    problem = VARIABLES[key][0](value)
    if problem and not usable(key, value):
        return (f"{key}: {problem}; fleet will not use this value (another role's variable of the "
                "same name?)")
    if problem is None and isinstance(value, str) and _TEMPLATE.search(value):
        problem = "fleet does not evaluate Jinja templates: give the value itself"
    if problem:
        raise InventoryError(where, f"{key}: {problem}")
    return None


def _check_unknown(key: str, value: Any, where: str) -> str | None:
    """A name neither fleet's nor Ansible's: refused when it is one edit from one of fleet's and its
    value fits that one, else kept with a warning when it is close to one."""
    hint = difflib.get_close_matches(key, VARIABLES, n=1, cutoff=0.8)
    if hint and _one_edit(key, hint[0]) and VARIABLES[hint[0]][0](value) is None:
        raise InventoryError(where, f"unknown variable {key!r}; did you mean {hint[0]!r}?")
    if hint:
        return f"{key!r} is not fleet's, and is kept (did you mean {hint[0]!r}?)"
    return None


def group_priority(value: Any, where: str) -> int:
    """``ansible_group_priority`` as Ansible reads it: ``int(value)``."""
    try:
        if isinstance(value, bool):
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise InventoryError(where,
                             "ansible_group_priority: a whole number is needed, not "
                             f"{value!r}") from None
