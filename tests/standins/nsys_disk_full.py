"""The stand-in nsys on a full disk, as nsys 2025.3 was recorded on an H200 test machine: its TMPDIR on a
64 MiB tmpfs that filled mid-run (tests/fixtures/launchers-h200/3-disk-full.txt, made by
tests/fixtures/launchers-h200/launchers-check.sh step 3)."""
import errno
import os
import re
import signal
import sys
import time

RECORDED = os.path.join(os.path.dirname(os.path.realpath(__file__)), "recorded", "launchers-h200", "3-disk-full.txt")


def termination_status(pid, status):
    """Writes the application's termination status where nsys 2025.3 did, in $TMPDIR (removed then:
    the stand-in leaves nothing there of its own); on a full disk, full_disk_hang."""
    folder = os.path.join(os.environ.get("TMPDIR") or "/tmp", "nvidia", "nsight_systems")
    path = os.path.join(folder, f"NSys-termination_status_{pid}-{os.stat('/proc/self/ns/pid').st_ino}-2025.3.2")
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, f"{status}\n".encode())
        finally:
            os.close(fd)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            full_disk_hang(path)
    for leftover in (path, folder, os.path.dirname(folder)):
        try:
            (os.unlink if leftover == path else os.rmdir)(leftover)
        except OSError:
            pass


def full_disk_hang(path):
    """What nsys 2025.3 did when its TMPDIR's disk was full (tests/fixtures/launchers-h200/3-disk-full.txt):
    WriteStreamException's lines, this disk's sizes and this file in them, and no end: it was still there
    when fleet's client was stopped 40 s on (once 200 s). Whether it heeded SIGTERM then was not recorded:
    the stand-in ignores SIGTERM and SIGINT, the worst case, and only SIGKILL ends it; with
    STANDIN_NSYS_FULL_DISK=dies-on-sigterm, the other case, SIGTERM ends it (and nothing else: the
    application's session, and whatever it left running there, lives on)."""
    st = os.statvfs(os.path.dirname(path))
    sizes = (f"Total size: {st.f_blocks * st.f_frsize} bytes, Used size: {(st.f_blocks - st.f_bfree) * st.f_frsize} "
             f"bytes, Free size to caller: {st.f_bavail * st.f_frsize} bytes")
    with open(RECORDED) as f:
        said = f.read().splitlines()
    first = next(i for i, line in enumerate(said) if line.startswith("ERROR: "))
    last = next(i for i, line in enumerate(said) if line.startswith("[boost::errinfo_file_name_*] = "))
    lines = [re.sub(r"Total size: \d+ bytes, Used size: \d+ bytes, Free size to caller: \d+ bytes", sizes, line)
             for line in said[first:last]] + [f"[boost::errinfo_file_name_*] = {path}"]
    dies = os.environ.get("STANDIN_NSYS_FULL_DISK") == "dies-on-sigterm"
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, signal.SIG_DFL if dies and s == signal.SIGTERM else signal.SIG_IGN)
    print("\n".join(lines), file=sys.stderr, flush=True)
    while True:
        time.sleep(60)
