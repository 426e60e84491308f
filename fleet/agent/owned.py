"""Node state fleet changes, and always puts back: owned sysctls, DCGM pause, GPU counter locks.

Runs ON THE NODE (standard library only, Python 3.8). The rules:

* Only sysctls the inventory lists for this node are ever written, and only
  to the listed value (the controller sends the list; the agent checks again).
* Before the first change the original value is recorded in a state file.
  Every run that needs the change registers itself as a holder (pid and the
  process's start time, so a reused pid is not mistaken for a live holder);
  the original comes back when the last holder leaves. All of it under one
  flock, so concurrent runs on a node count correctly.
* A holder that died without leaving (fleet or the agent killed) is found by
  the next agent on the node, or by ``fleet repair``, which restore. A Slurm
  job holds through its prolog-made marker (:mod:`holders`).
* The state directory belongs to root and is checked for owner, mode and
  symlinks before use: no other account can plant a value for root to
  "restore". Changing sysctls needs root anyway (reached through ``sudo -n``
  where it can be: :mod:`asroot`).
* GPU counter locks (:mod:`locks`) are flocks on files in /var/lock, one per GPU, shared by
  all users of the node; a lock dies with its process.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_holders as holders
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import holders

STATE_DIR = os.environ.get("FLEET_STATE_DIR", "/var/lib/fleet")


class OwnedError(Exception):
    """The node's state cannot be changed safely; nothing was changed."""


class LostRecord(OwnedError):
    """An owned sysctl is off the node's baseline (its config's word for the value outside
    fleet's jobs) and no state record says fleet changed it: the record was lost. Its value
    now is neither put back on a guess nor taken as the original to put back later."""


def _safe_dir(path):
    """Create or check a root-only directory; refuse anything another account could control."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OwnedError("%s must be a directory owned by uid %d and not writable by "
                         "others" % (path, os.geteuid()))


class State:
    """The state file, under its lock, as a context manager: ``with State() as s: ...``."""

    def __init__(self, directory=None, read_only=False):
        # read_only: `repair --dry-run`
        self.dir, self.read_only = directory or STATE_DIR, read_only

    def __enter__(self):
        if os.geteuid() != 0:
            raise OwnedError("changing node state needs root (log in as "
                             "root, or use the Slurm prolog)")
        _safe_dir(self.dir)
        self._lock = os.open(os.path.join(self.dir, "state.lock"),
                             os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            self.data = self._read(os.path.join(self.dir, "state.json"))
        except BaseException:
            os.close(self._lock)  # a refusal must not keep the lock
            raise
        return self

    @staticmethod
    def _read(path):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return {"sysctls": {}, "dcgm": None}
        with os.fdopen(fd) as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise OwnedError("%s is not private to uid %d: refusing to "
                                 "trust it" % (path, os.geteuid()))
            try:
                doc = json.load(f)
                why = _malformed(doc)
            except ValueError as e:
                why = "not JSON: %s" % e
        if why:  # what was changed, and from what, is unknown: nothing is put back by guess
            raise OwnedError("%s is corrupt (%s): fleet cannot tell what to put back; restore the "
                             "sysctls it names by hand (or `fleet repair` after fixing it), "
                             "then remove it" % (path, why))
        return doc

    def __exit__(self, *exc):
        try:
            if self.read_only:
                return
            tmp = os.path.join(self.dir, "state.json.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(self.data, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(self.dir, "state.json"))
        finally:
            os.close(self._lock)


def _malformed(doc):
    """What is wrong with a state record's shape, or None."""
    def holder_ok(h):
        if not isinstance(h, dict):
            return False
        if "job" in h:
            return isinstance(h["job"], str) and isinstance(h.get("marker"), str)
        return isinstance(h.get("pid"), int) and not isinstance(h["pid"], bool)

    if not isinstance(doc, dict) or not isinstance(doc.get("sysctls"), dict):
        return "no 'sysctls' mapping"
    for name, entry in doc["sysctls"].items():
        if not (isinstance(entry, dict) and isinstance(entry.get("original"), str)
                and isinstance(entry.get("holders"), list)
                and all(holder_ok(h) for h in entry["holders"])):
            return "the entry for %r is not {original, value, holders}" % name
    dcgm = doc.get("dcgm")
    if dcgm is not None and not (isinstance(dcgm, dict) and isinstance(dcgm.get("holders"), list)
                                 and all(holder_ok(h) for h in dcgm["holders"])):
        return "the 'dcgm' entry is not {holders}"
    return None


def sysctl_path(name):
    if "/" in name or name.startswith(".") or ".." in name:
        raise OwnedError("not a sysctl name: %r" % name)
    return "/proc/sys/" + name.replace(".", "/")


def read_sysctl(name):
    with open(sysctl_path(name)) as f:
        return f.read().strip()


def write_sysctl(name, value):
    with open(sysctl_path(name), "w") as f:
        f.write(str(value))


def acquire_sysctls(wanted, owned, holder, state_dir=None, baselines=None):
    """Set each wanted sysctl (name -> value) that ``owned`` allows; return what was changed.
    ``baselines`` (name -> the node's own value): a sysctl off it with no record of who changed
    it is LostRecord, and is not recorded with its changed value as the original."""
    for name, value in wanted.items():
        if name not in owned or str(owned[name]) != str(value):
            raise OwnedError("%s=%s is not owned by fleet on this node (owned_sysctls)" % (name,
                                                                                           value))
    changes = {}
    with State(state_dir) as s:
        _drop_dead(s)
        for name, value in wanted.items():
            entry = s.data["sysctls"].get(name)
            if entry is None:
                original = read_sysctl(name)
                _check_baseline(name, original, baselines, s.dir)
                entry = s.data["sysctls"][name] = {"original": original, "value": str(value),
                                                   "holders": []}
                write_sysctl(name, value)
            # a prolog run twice holds once
            if not any(holders.same(h, holder) for h in entry["holders"]):
                entry["holders"].append(holder)
            changes[name] = {"from": entry["original"], "to": str(value)}
        _settle(s)  # what only dead runs held goes back now
    return changes


def _check_baseline(name, now, baselines, state_dir):
    base = (baselines or {}).get(name)
    if base is not None and now != str(base):
        raise LostRecord("%s is %s on this node, not its baseline %s, and no record in %s says who "
                         "changed it (the state record was lost): not put back on a guess, nor "
                         "taken as its original"
                         % (name, now, base, os.path.join(state_dir, "state.json")))


def off_baseline(baselines, state_dir=None):
    """LostRecord for the first sysctl of ``baselines`` that is off its baseline here while no
    entry of the state record holds it (nobody is keeping it changed); None when all are."""
    with State(state_dir, read_only=True) as s:
        for name in sorted(baselines):
            if name not in s.data["sysctls"]:
                try:
                    _check_baseline(name, read_sysctl(name), baselines, s.dir)
                except LostRecord as e:
                    return e
    return None


def release(holder, state_dir=None):
    """Leave every entry this holder joined; put back what nobody holds any more."""
    with State(state_dir) as s:
        for entry in list(s.data["sysctls"].values()) + ([s.data["dcgm"]] if s.data.get("dcgm")
                                                         else []):
            entry["holders"] = [h for h in entry["holders"] if not holders.same(h, holder)]
        return _settle(s)


def repair(state_dir=None, dry_run=False):
    """Put back whatever only dead holders were keeping changed (``dry_run``: only say what)."""
    if not os.path.exists(os.path.join(state_dir or STATE_DIR, "state.json")):
        return {"restored": {}, "dcgm_resumed": False, "held": {}}
    with State(state_dir, read_only=dry_run) as s:
        _drop_dead(s)
        done = _settle(s, dry_run)
        done["held"] = {n: [h.get("pid") or "job %s" % h.get("job") for h in e["holders"]]
                        for n, e in s.data["sysctls"].items()}
        return done


def _drop_dead(s):
    for entry in list(s.data["sysctls"].values()) + ([s.data["dcgm"]] if s.data.get("dcgm")
                                                     else []):
        entry["holders"] = [h for h in entry["holders"] if holders.alive(h)]


def _settle(s, dry_run=False):
    """Put back what nobody holds; with ``dry_run`` only say so (its record is not written)."""
    restored, resumed = {}, False
    for name, entry in list(s.data["sysctls"].items()):
        if not entry["holders"]:
            if not dry_run:
                write_sysctl(name, entry["original"])
            restored[name] = entry["original"]
            del s.data["sysctls"][name]
    if s.data.get("dcgm") and not s.data["dcgm"]["holders"]:
        if not dry_run:
            dcgmi(["profile", "--resume"])
        s.data["dcgm"], resumed = None, True
    return {"restored": restored, "dcgm_resumed": resumed}


def dcgmi(args):
    out = subprocess.run(["dcgmi"] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=60)
    if out.returncode != 0:
        raise OwnedError("dcgmi %s failed: %s" % (" ".join(args),
                                                  out.stdout.decode(errors="replace").strip()))


def pause_dcgm(holder, state_dir=None):
    """``dcgmi profile --pause`` for the first holder; recorded, so a dead run's pause is undone."""
    with State(state_dir) as s:
        _drop_dead(s)
        if not s.data.get("dcgm"):
            dcgmi(["profile", "--pause"])
            s.data["dcgm"] = {"holders": []}
        s.data["dcgm"]["holders"].append(holder)
        _settle(s)


OPS = {"repair": repair, "acquire_sysctls": acquire_sysctls, "release": release,
       "pause_dcgm": pause_dcgm}
