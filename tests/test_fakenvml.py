"""The fake NVML library, driven through the real pynvml binding.

Each test writes a scenario, then runs a small script in a fresh interpreter
(pynvml loads libnvidia-ml.so.1 once per process, and LD_LIBRARY_PATH is only
read at process start) and compares what pynvml returns with the scenario.
"""

import json
import os

import pytest

from tests.harness import fakenvml
from tests.harness.pynvml_script import run, run_json

pytest.importorskip("pynvml")

GIB = 1 << 30

TWO_GPUS = {
    "driver": "575.51.03",
    "cuda": 12090,
    "nvml": "12.575.51.03",
    "gpus": [
        {},  # every field defaulted: an H200 at index 0
        {"uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "NVIDIA B200",
         "arch": 10, "compute_mode": 3, "mem_total": 191 * GIB, "bus": "00000001:9A:00.0",
         "minor": 7, "pci_id": 0x290110DE},
    ],
}


def test_system_and_device_attributes(lib_dir, scenario):
    fakenvml.write_scenario(scenario, TWO_GPUS)
    out = run_json(lib_dir, scenario, """
        N.nvmlInit()
        maps = open("/proc/self/maps").read()
        loaded = sorted({l.split()[-1] for l in maps.splitlines() if "libnvidia-ml" in l})
        gpus = []
        for i in range(N.nvmlDeviceGetCount()):
            h = N.nvmlDeviceGetHandleByIndex(i)
            pci = N.nvmlDeviceGetPciInfo(h)
            gpus.append(dict(
                index=N.nvmlDeviceGetIndex(h), uuid=N.nvmlDeviceGetUUID(h),
                name=N.nvmlDeviceGetName(h), arch=N.nvmlDeviceGetArchitecture(h),
                mig=N.nvmlDeviceGetMigMode(h), compute_mode=N.nvmlDeviceGetComputeMode(h),
                total=N.nvmlDeviceGetMemoryInfo(h).total, minor=N.nvmlDeviceGetMinorNumber(h),
                bus_id=pci.busId, legacy=pci.busIdLegacy,
                pci=[pci.domain, pci.bus, pci.device, pci.pciDeviceId],
                is_mig=N.nvmlDeviceIsMigDeviceHandle(h).value))
        print(json.dumps(dict(
            loaded=loaded, driver=N.nvmlSystemGetDriverVersion(),
            nvml=N.nvmlSystemGetNVMLVersion(), cuda=N.nvmlSystemGetCudaDriverVersion(),
            cuda2=N.nvmlSystemGetCudaDriverVersion_v2(), gpus=gpus,
            bad_index=err(N.nvmlDeviceGetHandleByIndex, 2),
            errstr=N.nvmlErrorString(N.NVML_ERROR_DRIVER_NOT_LOADED))))
        N.nvmlShutdown()
    """)
    # The library pynvml loaded really is the fake from lib_dir.
    assert out["loaded"] == [str(lib_dir.resolve() / "libnvidia-ml.so.1")]
    assert (out["driver"], out["nvml"], out["cuda"], out["cuda2"]) == \
        ("575.51.03", "12.575.51.03", 12090, 12090)
    assert out["bad_index"] == "NVMLError_InvalidArgument"
    assert out["errstr"] == "Driver Not Loaded"
    h200, b200 = out["gpus"]
    assert h200 == dict(index=0, uuid="GPU-fa4e0000-0000-0000-0000-000000000000",
                        name="NVIDIA H200", arch=9, mig=[0, 0], compute_mode=0,
                        total=150754820096, minor=0, bus_id="00000000:19:00.0",
                        legacy="0000:19:00.0", pci=[0, 0x19, 0, 0x233510DE], is_mig=0)
    assert b200 == dict(index=1, uuid="GPU-11111111-2222-3333-4444-555555555555",
                        name="NVIDIA B200", arch=10, mig=[0, 0], compute_mode=3,
                        total=191 * GIB, minor=7, bus_id="00000001:9A:00.0",
                        legacy="0001:9A:00.0", pci=[1, 0x9A, 0, 0x290110DE], is_mig=0)


PROCS = {"gpus": [
    {"processes": [
        {"kind": "compute", "pid": 1234, "mem": 3 * GIB},
        {"kind": "compute", "pid": 1235, "mem": 5 * GIB},
        {"kind": "graphics", "pid": 1234, "mem": 3 * GIB},   # C+G process: counted once in "used"
        {"kind": "graphics", "pid": 2000, "mem": 1 * GIB},
        {"kind": "mps", "pid": 3000, "mem": 2 * GIB},
        {"kind": "compute", "pid": 4000, "mem": None},       # not available -> None
    ]},
    {},  # no processes at all
    {"mem_used": 7 * GIB, "reserved": GIB, "processes": [{"pid": 5000, "mem": GIB}]},  # explicit used wins
]}
TOTAL, RESERVED = fakenvml.H200_MEM_TOTAL, fakenvml.H200_RESERVED


def test_process_lists_and_memory(lib_dir, scenario):
    fakenvml.write_scenario(scenario, PROCS)
    out = run_json(lib_dir, scenario, """
        N.nvmlInit()
        res = []
        for i in range(3):
            h = N.nvmlDeviceGetHandleByIndex(i)
            m1 = N.nvmlDeviceGetMemoryInfo(h)
            m2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
            res.append(dict(
                compute=procs(N.nvmlDeviceGetComputeRunningProcesses(h)),
                graphics=procs(N.nvmlDeviceGetGraphicsRunningProcesses(h)),
                mps=procs(N.nvmlDeviceGetMPSComputeRunningProcesses(h)),
                compute_v2=procs(N.nvmlDeviceGetComputeRunningProcesses_v2(h)),
                mem1=[m1.total, m1.used, m1.free],
                mem2=[m2.total, m2.reserved, m2.used, m2.free]))
        h = N.nvmlDeviceGetHandleByIndex(0)
        print(json.dumps(dict(gpus=res, bad_version=err(N.nvmlDeviceGetMemoryInfo, h, 1))))
    """)
    na = 0xFFFFFFFF
    g0, g1, g2 = out["gpus"]
    assert g0["compute"] == [[1234, 3 * GIB, na, na], [1235, 5 * GIB, na, na], [4000, None, na, na]]
    assert g0["compute_v2"] == g0["compute"]
    assert g0["graphics"] == [[1234, 3 * GIB, na, na], [2000, GIB, na, na]]
    assert g0["mps"] == [[3000, 2 * GIB, na, na]]
    # v2: the processes' memory and the driver's reservation apart; v1 counts both as used.
    used = (3 + 5 + 1 + 2) * GIB
    assert g0["mem1"] == [TOTAL, used + RESERVED, TOTAL - used - RESERVED]
    assert g0["mem2"] == [TOTAL, RESERVED, used, TOTAL - used - RESERVED]
    assert g1 == dict(compute=[], graphics=[], mps=[], compute_v2=[],
                      mem1=[TOTAL, RESERVED, TOTAL - RESERVED], mem2=[TOTAL, RESERVED, 0, TOTAL - RESERVED])
    assert g2["compute"] == [[5000, GIB, na, na]]
    assert g2["mem1"] == [TOTAL, 8 * GIB, TOTAL - 8 * GIB]
    assert g2["mem2"] == [TOTAL, GIB, 7 * GIB, TOTAL - 8 * GIB]
    assert out["bad_version"] == "NVMLError_ArgumentVersionMismatch"


def test_process_list_size_protocol(lib_dir, scenario):
    """The raw C contract pynvml relies on: count 0 -> INSUFFICIENT_SIZE plus the needed count."""
    fakenvml.write_scenario(scenario, {"gpus": [
        {"processes": [{"pid": 100 + i, "mem": i, "gi": i, "ci": 2 * i} for i in range(20)]}, {}]})
    out = run_json(lib_dir, scenario, """
        N.nvmlInit()
        fn = N.nvmlLib.nvmlDeviceGetComputeRunningProcesses_v3
        h = N.nvmlDeviceGetHandleByIndex(0)
        count = ctypes.c_uint(0)
        first = fn(h, ctypes.byref(count), None)
        needed = count.value
        arr = (N.c_nvmlProcessInfo_v3_t * 5)()
        count.value = 5
        small = fn(h, ctypes.byref(count), arr)
        small_count = count.value
        empty = ctypes.c_uint(0)
        none = fn(N.nvmlDeviceGetHandleByIndex(1), ctypes.byref(empty), None)
        full = procs(N.nvmlDeviceGetComputeRunningProcesses(h))
        print(json.dumps(dict(first=first, needed=needed, small=small, small_count=small_count,
                              none=[none, empty.value], full=full,
                              struct_size=ctypes.sizeof(N.c_nvmlProcessInfo_v3_t))))
    """)
    assert out["struct_size"] == 24
    assert (out["first"], out["needed"]) == (7, 20)        # NVML_ERROR_INSUFFICIENT_SIZE
    assert (out["small"], out["small_count"]) == (7, 20)
    assert out["none"] == [0, 0]
    assert out["full"] == [[100 + i, i, i, 2 * i] for i in range(20)]


UTIL = {"gpus": [
    {"util": 99, "mem_util": 40, "processes": [
        {"kind": "compute", "pid": 100, "sm": 97},
        {"kind": "graphics", "pid": 100, "sm": 50},  # one sample per pid: the first line's
        {"kind": "compute", "pid": 101, "sm": 0},    # idle, but sampled (as a tenant with a context)
        {"kind": "compute", "pid": 102}]},           # no sm: no sample
    {"processes": [{"pid": 103}]},                   # nothing sampled at all
    {"mig": 1, "processes": [{"pid": 104, "sm": 10}]},
]}


def test_utilization(lib_dir, scenario):
    fakenvml.write_scenario(scenario, UTIL)
    out = run_json(lib_dir, scenario, """
        import time
        N.nvmlInit()
        h0, h1, h2 = (N.nvmlDeviceGetHandleByIndex(i) for i in range(3))
        u = N.nvmlDeviceGetUtilizationRates(h0)
        before = int(time.time() * 1e6)
        samples = [[s.pid, s.smUtil, s.memUtil, s.encUtil, s.decUtil, s.timeStamp - before]
                   for s in N.nvmlDeviceGetProcessUtilization(h0, 0)]
        fn, count = N.nvmlLib.nvmlDeviceGetProcessUtilization, ctypes.c_uint(0)
        first = [fn(h0, None, ctypes.byref(count), ctypes.c_ulonglong(0)), count.value]
        arr = (N.c_nvmlProcessUtilizationSample_t * 1)()
        count.value = 1
        small = [fn(h0, arr, ctypes.byref(count), ctypes.c_ulonglong(0)), count.value]
        print(json.dumps(dict(
            rates=[u.gpu, u.memory], samples=samples, first=first, small=small,
            future=err(N.nvmlDeviceGetProcessUtilization, h0, before + 10**9),
            idle_rates=[N.nvmlDeviceGetUtilizationRates(h1).gpu, N.nvmlDeviceGetUtilizationRates(h1).memory],
            idle=err(N.nvmlDeviceGetProcessUtilization, h1, 0),
            mig=[err(N.nvmlDeviceGetUtilizationRates, h2), err(N.nvmlDeviceGetProcessUtilization, h2, 0)])))
    """)
    assert out["rates"] == [99, 40] and out["idle_rates"] == [0, 0]
    assert [s[:5] for s in out["samples"]] == [[100, 97, 0, 0, 0], [101, 0, 0, 0, 0]]
    assert all(0 <= s[5] < 60 * 10**6 for s in out["samples"])  # stamped now, in microseconds
    assert out["first"] == out["small"] == [7, 2]  # NVML_ERROR_INSUFFICIENT_SIZE and the count
    assert out["future"] == out["idle"] == "NVMLError_NotFound"  # no sample newer than asked, none at all
    assert out["mig"] == ["NVMLError_NotSupported"] * 2


MIG = {"gpus": [
    {"mig": 1, "mig_pending": 1, "mem_total": 150754820096,
     "mig_instances": [
         {"gi": 1, "ci": 0, "uuid": "MIG-aaaaaaaa-0000-0000-0000-000000000001",
          "name": "NVIDIA H200 MIG 3g.71gb", "mem_total": 71 * GIB},
         {"gi": 2, "ci": 0, "uuid": "MIG-aaaaaaaa-0000-0000-0000-000000000002",
          "name": "NVIDIA H200 MIG 1g.18gb", "mem_total": 18 * GIB, "reserved": 256 << 20}],
     "processes": [
         {"kind": "compute", "pid": 10, "mem": 2 * GIB, "gi": 1, "ci": 0},
         {"kind": "compute", "pid": 11, "mem": 3 * GIB, "gi": 2, "ci": 0},
         {"kind": "mps", "pid": 12, "mem": GIB, "gi": 2, "ci": 0}]},
    {"mig": 0, "mig_pending": 1},  # MIG enable pending a reset
]}


def test_mig(lib_dir, scenario):
    fakenvml.write_scenario(scenario, MIG)
    out = run_json(lib_dir, scenario, """
        N.nvmlInit()
        gpu = N.nvmlDeviceGetHandleByIndex(0)
        migs = []
        for i in range(N.nvmlDeviceGetMaxMigDeviceCount(gpu)):
            try:
                m = N.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i)
            except N.NVMLError_NotFound:
                continue
            parent = N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
            mem = N.nvmlDeviceGetMemoryInfo(m)
            migs.append(dict(
                slot=i, is_mig=N.nvmlDeviceIsMigDeviceHandle(m).value,
                gi=N.nvmlDeviceGetGpuInstanceId(m), ci=N.nvmlDeviceGetComputeInstanceId(m),
                uuid=N.nvmlDeviceGetUUID(m), name=N.nvmlDeviceGetName(m),
                mem=[mem.total, mem.used], parent=N.nvmlDeviceGetUUID(parent),
                compute=procs(N.nvmlDeviceGetComputeRunningProcesses(m)),
                mps=procs(N.nvmlDeviceGetMPSComputeRunningProcesses(m))))
        other = N.nvmlDeviceGetHandleByIndex(1)
        print(json.dumps(dict(
            mode=N.nvmlDeviceGetMigMode(gpu), max=N.nvmlDeviceGetMaxMigDeviceCount(gpu),
            migs=migs, gpu_uuid=N.nvmlDeviceGetUUID(gpu),
            gpu_compute=procs(N.nvmlDeviceGetComputeRunningProcesses(gpu)),
            past_max=err(N.nvmlDeviceGetMigDeviceHandleByIndex, gpu, 7),
            other_mode=N.nvmlDeviceGetMigMode(other),
            other_max=N.nvmlDeviceGetMaxMigDeviceCount(other),
            other_gi=err(N.nvmlDeviceGetGpuInstanceId, other),
            other_parent=err(N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, other))))
    """)
    assert out["mode"] == [1, 1] and out["max"] == 7
    assert out["other_mode"] == [0, 1] and out["other_max"] == 0
    assert out["past_max"] == "NVMLError_InvalidArgument"
    assert out["other_gi"] == out["other_parent"] == "NVMLError_InvalidArgument"
    assert out["gpu_compute"] == [[10, 2 * GIB, 1, 0], [11, 3 * GIB, 2, 0]]
    a, b = out["migs"]
    assert a == dict(slot=0, is_mig=1, gi=1, ci=0, uuid="MIG-aaaaaaaa-0000-0000-0000-000000000001",
                     name="NVIDIA H200 MIG 3g.71gb", mem=[71 * GIB, 2 * GIB],  # reserved: 0 by default
                     parent=out["gpu_uuid"], compute=[[10, 2 * GIB, 1, 0]], mps=[])
    assert b == dict(slot=1, is_mig=1, gi=2, ci=0, uuid="MIG-aaaaaaaa-0000-0000-0000-000000000002",
                     name="NVIDIA H200 MIG 1g.18gb", mem=[18 * GIB, 4 * GIB + (256 << 20)],
                     parent=out["gpu_uuid"], compute=[[11, 3 * GIB, 2, 0]], mps=[[12, GIB, 2, 0]])


@pytest.mark.parametrize("code, exc", [
    (9, "NVMLError_DriverNotLoaded"),
    (18, "NVMLError_LibRmVersionMismatch"),
    (4, "NVMLError_NoPermission"),
])
def test_init_error(lib_dir, scenario, code, exc):
    fakenvml.write_scenario(scenario, {**TWO_GPUS, "init_error": code})
    out = run_json(lib_dir, scenario, "print(json.dumps(err(N.nvmlInit)))")
    assert out == exc


def test_missing_scenario_variable_means_driver_not_loaded(lib_dir, scenario):
    proc = run(lib_dir, scenario, "print(json.dumps(err(N.nvmlInit)))",
               extra_env={"FAKE_NVML_SCENARIO": ""})
    assert json.loads(proc.stdout) == "NVMLError_DriverNotLoaded"


@pytest.mark.parametrize("bad_line, message", [
    ("gpuz index=0", "unknown record type"),
    ("gpu index=zero", "not a number"),
    ("gpu index=0 colour=green", "unknown gpu field: colour"),
    ("mig gpu=0 bus=00:01.0", "unknown mig field: bus"),
    ("proc gpu=0 pid=4294967296", "number out of range"),
    ("gpu index=0 uuid", "expected key=value"),
    ("proc gpu=0 kind=video pid=1", "kind must be"),
    ("proc gpu=3 pid=1", "proc refers to an undefined gpu"),
    ("gpu index=0 util=101", "number out of range"),
    ("proc gpu=0 pid=1 sm=-1", "not a non-negative number"),
    ("proc gpu=0 pid=1 pidns=4026531836,4026532177 nspid=1", "nspid needs one pid per pidns entry"),
    ("proc gpu=0 pid=1 pidns=4026531836,,4026532177", "not a non-negative number"),
    ("proc gpu=0 pid=1 pidns=4294967296", "number out of range"),
    ("driver 580.159.04 extra", "unexpected text"),
])
def test_malformed_scenario_names_file_and_line(lib_dir, scenario, bad_line, message):
    scenario.write_text("# comment\n\ndriver 580.159.04\n" + bad_line + "\n")
    proc = run(lib_dir, scenario, "print(json.dumps(err(N.nvmlInit)))")
    assert json.loads(proc.stdout) == "NVMLError_Unknown"
    assert f"{scenario.resolve()}:4: {message}" in proc.stderr


def test_scenario_reread_on_every_init(lib_dir, scenario, tmp_path):
    first = {"gpus": [{"processes": [{"pid": 1, "mem": GIB}]}]}
    fakenvml.write_scenario(scenario, first)
    again = fakenvml.write_scenario(tmp_path / "again.txt", first)
    later = fakenvml.write_scenario(tmp_path / "later.txt", {"driver": "590.1.2", "gpus": [
        {"name": "NVIDIA H100 80GB HBM3"}, {}]})
    # The script swaps the scenario file itself, between its own nvmlInit calls.
    out = run_json(lib_dir, scenario, f"""
        def snap():
            h = N.nvmlDeviceGetHandleByIndex(0)
            return [N.nvmlSystemGetDriverVersion(), N.nvmlDeviceGetCount(), N.nvmlDeviceGetName(h),
                    procs(N.nvmlDeviceGetComputeRunningProcesses(h))]
        path = os.environ["FAKE_NVML_SCENARIO"]
        N.nvmlInit()
        before = snap()
        os.replace({str(later)!r}, path)
        still = snap()                      # no re-read between nvmlInit calls
        N.nvmlInit()                        # nested nvmlInit re-reads too
        nested = snap()
        N.nvmlShutdown()                    # one Shutdown per Init: still usable
        after_one_shutdown = N.nvmlDeviceGetCount()
        N.nvmlShutdown()
        after_shutdown = err(N.nvmlDeviceGetCount)
        extra_shutdown = err(N.nvmlShutdown)
        os.replace({str(again)!r}, path)
        N.nvmlInit()
        after = snap()
        print(json.dumps(dict(before=before, still=still, nested=nested,
                              after_one_shutdown=after_one_shutdown, after_shutdown=after_shutdown,
                              extra_shutdown=extra_shutdown, after=after)))
    """)
    one_gpu = ["580.159.04", 1, "NVIDIA H200", [[1, GIB, 0xFFFFFFFF, 0xFFFFFFFF]]]
    assert out["before"] == out["still"] == out["after"] == one_gpu
    assert out["nested"] == ["590.1.2", 2, "NVIDIA H100 80GB HBM3", []]
    assert out["after_one_shutdown"] == 2
    assert out["after_shutdown"] == out["extra_shutdown"] == "NVMLError_Uninitialized"


@pytest.mark.parametrize("call", [
    "N.nvmlDeviceGetEnforcedPowerLimit(h)",
    # Answered "Argument Version Mismatch" by driver 580.159.04 with this binding: not simulated.
    "N.nvmlDeviceGetRunningProcessDetailList(h, N.nvmlProcessDetailList_v1, 0)",
])
def test_unimplemented_function_is_not_found(lib_dir, scenario, call):
    fakenvml.write_scenario(scenario, TWO_GPUS)
    out = run_json(lib_dir, scenario, f"""
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        print(json.dumps(err(lambda: {call})))
    """)
    assert out == "NVMLError_FunctionNotFound"


def test_build_reuses_fresh_library_and_rebuilds_stale(tmp_path):
    lib = fakenvml.build(tmp_path) / "libnvidia-ml.so.1"
    assert lib.read_bytes()[:4] == b"\x7fELF"
    lib.write_bytes(b"sentinel")                   # newer than the source: kept as is
    fakenvml.build(tmp_path)
    assert lib.read_bytes() == b"sentinel"
    os.utime(lib, (0, 0))                          # older than the source: rebuilt
    fakenvml.build(tmp_path)
    assert lib.read_bytes()[:4] == b"\x7fELF"


def test_build_without_gcc_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(fakenvml, "_COMPILED", None)  # nothing compiled yet in this process
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(fakenvml.BuildError, match="gcc not found"):
        fakenvml.build(tmp_path / "lib")


def test_env_puts_library_first(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/elsewhere")
    e = fakenvml.env(tmp_path, tmp_path / "s.txt")
    assert e == {"LD_LIBRARY_PATH": f"{tmp_path.resolve()}:/opt/elsewhere",
                 "FAKE_NVML_SCENARIO": str((tmp_path / "s.txt").resolve())}
