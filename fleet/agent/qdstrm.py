"""nsys's data (a ``.qdstrm``) finished into its report on the node, with the installation's
``QdstrmImporter``: the importer found, run in a process group of its own and bounded, and each
NAME.qdstrm nsys left at the run's own output name finished.

Runs ON THE NODE (standard library, Python 3.8), for :mod:`reports` (a run's leftovers) and
:mod:`slurmd` (the Epilog's, with the node's own importer). nsys 2025.3 leaves its data
unfinished when it is killed, or when its importer cannot run.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_node as node
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import node

# QdstrmImporter on a large collection takes minutes; one that hangs is stopped
IMPORT_TIMEOUT = 600.0


def importer_for(nsys):
    """The QdstrmImporter that finishes a .qdstrm: the one of the same nsys installation,
    else (nsys reached through a wrapper script, as module systems do) the newest installed."""
    here = os.path.dirname(os.path.realpath(nsys)) if nsys else "/nonexistent"
    for pattern in ("QdstrmImporter", "../*/QdstrmImporter", "../../*/QdstrmImporter"):
        hits = sorted(glob.glob(os.path.join(here, pattern)))
        if hits:
            return os.path.normpath(hits[0])
    return installed_importer()


def installed_importer():
    """The newest QdstrmImporter of the Nsight installations under /opt/nvidia, or None."""
    installed = glob.glob("/opt/nvidia/nsight-systems/*/host-linux-x64/QdstrmImporter") + \
        glob.glob("/opt/nvidia/nsight-compute/*/host/*/QdstrmImporter")
    return sorted(installed, key=node.version_key)[-1] if installed else None


def finish_leftovers(plan, stem, tail, notes, killed, finish, unfinished):
    """nsys's data left at the run's own output name (NAME.qdstrm), this run's whatever nsys's exit
    status: each finished into its report (an empty report file in its way removed first), unless
    not to ``finish`` (the disk is full); the leftovers finished. Each left without its report
    adds its line to ``unfinished`` as well as to ``notes``."""
    finished = set()
    for leftover in sorted(glob.glob(stem + ".qdstrm")):
        report = leftover[: -len(".qdstrm")] + ".nsys-rep"
        if os.path.exists(report) and os.path.getsize(report) > 0:
            continue
        if not finish:
            said = ("nsys's data %s is left unfinished: the disk is full, no report "
                    "can be made there" % leftover)
            notes.append(said)
            unfinished.append(said)
            continue
        if os.path.exists(report):
            notes.append("%s is empty, not a report: its data %s is finished instead" % (report,
                                                                                         leftover))
            os.unlink(report)
        elif not killed:
            notes.append(left_unfinished(leftover, tail))
        done, said = importing(importer_for(plan.nsys), leftover)
        notes.append(said)
        if done is None:
            unfinished.append(said)
        finished.add(done)
    return finished


def left_unfinished(leftover, tail):
    """What to say of a .qdstrm nsys left at the output name though it was not killed: nsys 2025.3
    does so, and exits 0, when its importer cannot run (seen on an H200 test machine: libdw.so.1
    missing), after saying so at its start."""
    said = [line.strip().decode(errors="replace") for line in tail.splitlines()
            if b"importer" in line.lower()]
    return "nsys left its data unfinished at %s%s" % (leftover, "; it said: "
                                                      + " ".join(said[-2:]) if said else "")


def finish_qdstrm(importer, leftover, notes, timeout=IMPORT_TIMEOUT, own_group=True):
    """The finished report's path, or None; a note says which (:func:`importing`)."""
    report, said = importing(importer, leftover, timeout, own_group)
    notes.append(said)
    return report


def importing(importer, leftover, timeout=IMPORT_TIMEOUT, own_group=True):
    """(the finished report's path or None, the line that says so). The importer runs in a process
    group of its own (``own_group``; else in the caller's, which the caller kills), killed whole at
    ``timeout``."""
    if importer is None:
        return None, "unfinished report %s: no QdstrmImporter found" % leftover
    try:
        proc = subprocess.Popen([importer, "-i", leftover], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=own_group)
    except OSError as e:
        return None, "QdstrmImporter %s cannot run: %s" % (importer, e)
    try:
        said, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL) if own_group else proc.kill()
        proc.communicate()
        return None, "QdstrmImporter did not finish %s within %d s: stopped" % (leftover, timeout)
    report = leftover[: -len(".qdstrm")] + ".nsys-rep"
    if proc.returncode == 0 and os.path.exists(report):
        return report, "finished %s with %s" % (report, importer)
    return None, "QdstrmImporter could not finish %s (exit %s): %s" % (
        leftover, proc.returncode, said.decode(errors="replace").strip()[-300:])
