"""Helpers for tests that run the real pynvml against the fake NVML library.

The fake (tests/fakenvml/*.c) is built with gcc into a directory as
``libnvidia-ml.so.1``; a process that has that directory on LD_LIBRARY_PATH and
FAKE_NVML_SCENARIO pointing at a scenario file sees the GPUs the file describes.

    lib_dir = fakenvml.build(tmp_path / "lib")
    fakenvml.write_scenario(tmp_path / "gpus.txt", {"gpus": [{"index": 0}]})
    subprocess.run([...], env={**os.environ, **fakenvml.env(lib_dir, tmp_path / "gpus.txt")})
"""

from __future__ import annotations

import atexit
import fcntl
import os
import pathlib
import shutil
import subprocess
import tempfile

SOURCE_DIR = pathlib.Path(__file__).resolve().parent.parent / "fakenvml"
SOURCE = SOURCE_DIR / "fakenvml.c"  # the scenario format is described at its top
LIB_NAME = "libnvidia-ml.so.1"

# Defaults for omitted fields: one NVIDIA H200 (Hopper, NVML arch 9).
H200_NAME = "NVIDIA H200"
H200_ARCH = 9
H200_MEM_TOTAL = 150754820096
H200_RESERVED = 644939776  # nvmlMemory_v2_t.reserved of an H200, driver 580.159.04 (the fake's default)
NO_ID = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of a process outside MIG
PROC_PID_INIT_INO = 0xEFFFFFFC  # inode of the initial PID namespace
NS_GET_PARENT = 0xB702  # ioctl _IO(0xb7, 0x2) of linux/nsfs.h: the parent of a namespace


# Per-GPU clocks, clock event reasons (bits), temperature (C) and power (mW); None: the driver
# answers NOT_SUPPORTED. Omitted: an idle H200's (the fake's defaults, see fakenvml.c).
CONDITIONS = ("sm_clock", "mem_clock", "video_clock", "reasons", "temp", "power")


def _na(value):
    return "na" if value is None else value


class BuildError(RuntimeError):
    """The fake NVML library could not be compiled."""


_COMPILED: pathlib.Path | None = None  # this test process's one compiled library (see _compiled)


def _newest_source() -> float:
    return max(f.stat().st_mtime for f in [*SOURCE_DIR.glob("*.c"), *SOURCE_DIR.glob("*.h")])


def _compiled() -> pathlib.Path:
    """The library, compiled once per test process (about 0.65 s of gcc each time otherwise) into a
    folder of this process's own, removed when it exits; compiled again only where a source changed."""
    global _COMPILED
    if _COMPILED is not None and _COMPILED.exists() and _COMPILED.stat().st_mtime > _newest_source():
        return _COMPILED
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError("gcc not found on PATH: it is needed to build the fake NVML "
                         f"library from {SOURCE_DIR}")
    home = pathlib.Path(tempfile.mkdtemp(prefix="fleet-fakenvml-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    lib = home / LIB_NAME
    cmd = [gcc, "-O2", "-Wall", "-Wextra", "-shared", "-fPIC", "-o", str(lib), *map(str, sorted(SOURCE_DIR.glob("*.c")))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"building the fake NVML failed ({' '.join(cmd)}):\n{proc.stderr}")
    _COMPILED = lib
    return lib


def build(dest_dir: str | os.PathLike) -> pathlib.Path:
    """The fake NVML as ``dest_dir/libnvidia-ml.so.1`` (a copy of the one this process compiled);
    return ``dest_dir``. Kept as it is where it is newer than every source file."""
    dest = pathlib.Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    lib = dest / LIB_NAME
    if lib.exists() and lib.stat().st_mtime > _newest_source():
        return dest
    # Written to a temporary name and renamed, so a concurrent loader never sees half a file.
    partial = dest / (LIB_NAME + ".partial")
    shutil.copyfile(_compiled(), partial)
    partial.chmod(0o755)
    partial.replace(lib)
    return dest


def pid_namespaces(pid: int) -> tuple[list[int], list[int]] | None:
    """The PID namespaces process ``pid`` is in and its pid in each, outermost first.

    The namespaces are inodes: /proc/PID/ns/pid and its parents (ioctl
    NS_GET_PARENT, as far up as this process's own namespace); the pids are the
    NSpid line of /proc/PID/status. Both lists end with the process's own
    namespace and are cut to the same length. None when the process does not
    exist or cannot be inspected.
    """
    try:
        fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY)
    except OSError:
        return None
    inodes = []
    try:
        while True:
            inodes.append(os.fstat(fd).st_ino)
            try:
                parent = fcntl.ioctl(fd, NS_GET_PARENT)
            except OSError:  # EPERM: the initial namespace, or one above ours
                break
            os.close(fd)
            fd = parent
    finally:
        os.close(fd)
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
    n = min(len(inodes), len(nspid))
    if not n:
        return None
    return inodes[::-1][-n:], [int(x) for x in nspid[-n:]]


def _ns_fields(proc: dict) -> dict:
    """pidns/nspid of a scenario process: as the dict gives them (None: none), else measured."""
    if "pidns" in proc or "nspid" in proc:
        ns, ids = proc.get("pidns"), proc.get("nspid")
    else:
        ns, ids = pid_namespaces(proc["pid"]) or (None, None)
    join = lambda v: None if v is None else ",".join(map(str, v if isinstance(v, (list, tuple)) else [v]))
    return {"pidns": join(ns), "nspid": join(ids)}


def _value(v) -> str:
    s = str(v)
    if any(c in s for c in '"#\n'):
        raise ValueError(f"scenario values cannot contain quotes, '#' or newlines: {s!r}")
    return f'"{s}"' if (" " in s or "\t" in s or not s) else s


def _line(record: str, fields: dict) -> str:
    return " ".join([record] + [f"{k}={_value(v)}" for k, v in fields.items() if v is not None])


def write_scenario(path: str | os.PathLike, scenario: dict) -> pathlib.Path:
    """Write ``scenario`` (a dict) in the fake NVML's text format to ``path``.

    Keys: init_error, driver, cuda, nvml, gpus. Each GPU dict may hold index,
    uuid, name, arch, mig, mig_pending, compute_mode, mem_total, mem_used,
    reserved, bus, minor, pci_id, max_mig, util, mem_util, gpm_supported
    (default: by arch, as the driver), gpm (metric id -> value, or (value,
    nvmlReturn): what nvmlGpmMetricsGet answers; see gpm_recorded), the conditions
    (sm_clock, mem_clock, video_clock, reasons, temp, power: None for
    NOT_SUPPORTED), processes and mig_instances; a process dict holds kind (compute/graphics/mps), pid, mem
    (bytes, or None for "not available"), gi, ci, sm, pidns, nspid; a MIG
    instance dict holds gi, ci, uuid, name, mem_total, mem_used, reserved.
    Omitted GPU fields default to an H200 with index = position in the list.

    Memory, as the driver: the v2 call's used is the sum of the device's
    processes' mem (every process, whatever the caller's namespace) unless
    mem_used is given, its reserved is reserved (default H200_RESERVED on a
    GPU, 0 on a MIG instance); the v1 call's used is v2 used + reserved.

    Utilization: util and mem_util (percent, default 0) are the GPU's
    utilization rates; a process with sm (percent, 0 included) has a sample in
    nvmlDeviceGetProcessUtilization, under its host pid whatever the caller's
    namespace, as the driver; without any such process the call answers
    NVML_ERROR_NOT_FOUND.

    PID namespaces: the fake lists a process only to a caller in its PID
    namespace (or an ancestor of it, or the initial namespace), as the driver
    does. For a process that exists now, pidns (its namespaces' inodes,
    outermost first) and nspid (its pid in each) are measured here (see
    pid_namespaces); a process dict may give them instead (a number or a
    list; pidns None: no namespace data, listed to every caller, as a pid
    that does not exist is).

    Live state: rewriting the file (this function writes then renames) changes what the
    memory, process, utilization and conditions calls answer from the next call on, also in
    a process that holds NVML open, as a process arriving on a real GPU would.
    """
    lines = ["# fake NVML scenario, written by tests/harness/fakenvml.py"]
    if scenario.get("init_error") is not None:
        lines.append(f"init_error {int(scenario['init_error'])}")
    lines.append(f"driver {_value(scenario.get('driver', '580.159.04'))}")
    lines.append(f"cuda {int(scenario.get('cuda', 13000))}")
    if scenario.get("nvml") is not None:
        lines.append(f"nvml {_value(scenario['nvml'])}")
    for pos, gpu in enumerate(scenario.get("gpus", [])):
        index = gpu.get("index", pos)
        lines.append(_line("gpu", {
            "index": index,
            "uuid": gpu.get("uuid", f"GPU-fa4e0000-0000-0000-0000-{index:012d}"),
            "name": gpu.get("name", H200_NAME),
            "arch": gpu.get("arch", H200_ARCH),
            "mig": gpu.get("mig", 0),
            "mig_pending": gpu.get("mig_pending", gpu.get("mig", 0)),
            "compute_mode": gpu.get("compute_mode", 0),
            "mem_total": gpu.get("mem_total", H200_MEM_TOTAL),
            "mem_used": gpu.get("mem_used"),
            "reserved": gpu.get("reserved"),
            "bus": gpu.get("bus", f"00000000:{0x19 + index:02X}:00.0"),
            "minor": gpu.get("minor", index),
            "pci_id": gpu.get("pci_id"),
            "max_mig": gpu.get("max_mig"),
            "util": gpu.get("util"),
            "mem_util": gpu.get("mem_util"),
            **{k: _na(gpu[k]) for k in CONDITIONS if k in gpu},
            "gpm": None if gpu.get("gpm_supported") is None else int(bool(gpu["gpm_supported"])),
        }))
        for metric, answer in sorted((gpu.get("gpm") or {}).items()):
            value, ret = answer if isinstance(answer, tuple) else (answer, 0)
            lines.append(_line("gpm", {"gpu": index, "id": metric, "value": repr(float(value)), "return": ret}))
        for n, mig in enumerate(gpu.get("mig_instances", [])):
            lines.append(_line("mig", {
                "gpu": index,
                "gi": mig.get("gi", n + 1),
                "ci": mig.get("ci", 0),
                "uuid": mig.get("uuid", f"MIG-fa4e0000-0000-0000-{index:04d}-{n:012d}"),
                "name": mig.get("name", f"{gpu.get('name', H200_NAME)} MIG 1g.18gb"),
                "mem_total": mig.get("mem_total", 18 << 30),
                "mem_used": mig.get("mem_used"),
                "reserved": mig.get("reserved"),
            }))
        for proc in gpu.get("processes", []):
            mem = proc.get("mem", 0)
            lines.append(_line("proc", {
                "gpu": index,
                "kind": proc.get("kind", "compute"),
                "pid": proc["pid"],
                "mem": "na" if mem is None else mem,
                "gi": proc.get("gi", NO_ID),
                "ci": proc.get("ci", NO_ID),
                "sm": proc.get("sm"),
                **_ns_fields(proc),
            }))
    path = pathlib.Path(path)
    # Write then rename: a process calling nvmlInit meanwhile reads the old or new file, never half.
    partial = path.with_name(path.name + ".partial")
    partial.write_text("\n".join(lines) + "\n")
    partial.replace(path)
    return path


def env(lib_dir: str | os.PathLike, scenario_path: str | os.PathLike) -> dict[str, str]:
    """Environment variables that make pynvml load the fake with this scenario.

    The library directory goes first on LD_LIBRARY_PATH (keeping any existing
    entries after it), so it wins over a real libnvidia-ml.so.1.
    """
    lib_dir = str(pathlib.Path(lib_dir).resolve())
    old = os.environ.get("LD_LIBRARY_PATH")
    return {
        "LD_LIBRARY_PATH": f"{lib_dir}:{old}" if old else lib_dir,
        "FAKE_NVML_SCENARIO": str(pathlib.Path(scenario_path).resolve()),
    }


GPM_RECORDING = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "gpm-h200" / "gpm.json"


def gpm_recorded(phase: str, sample: int = -1) -> dict:
    """One second of an H200 as recorded (tests/fixtures/gpm-h200: ``idle``, ``gemm``,
    ``holding``, ``ncu``), as the GPU fields of a scenario: GPM's metrics with their return
    codes, the utilization rates, power, SM clock, clock event reasons and temperature. The
    processes are the test's own to give (the recorded pids were the H200's)."""
    import json

    row = json.loads(GPM_RECORDING.read_text())["phases"][phase]["samples"][sample]
    plain = lambda v: None if isinstance(v, dict) else v  # {"nvml_error": ...}: not supported
    return {"gpm": {m["id"]: (m["value"], m["return"]) for m in row["gpm"].values()},
            "util": row["utilization"]["gpu"], "mem_util": row["utilization"]["memory"],
            "power": plain(row["power_mw"]), "sm_clock": plain(row["sm_clock_mhz"]),
            "reasons": plain(row["clock_reasons"]), "temp": plain(row["temperature_c"])}
