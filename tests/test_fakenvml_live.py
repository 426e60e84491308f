"""The fake NVML's conditions calls and its live state, through the real pynvml: the values and
NOT_SUPPORTED answers an H200 gave (tests/fixtures/tools-2025.3-h200/nvml-conditions), and a
process appearing while NVML is held open, as on a real GPU (the run watch holds it open)."""

import json

import pytest

from tests.harness import fakenvml
from tests.harness.pynvml_script import run_json

pytest.importorskip("pynvml")

H200_IDLE = json.load(open(fakenvml.SOURCE_DIR.parent / "fixtures" / "tools-2025.3-h200" / "nvml-conditions"
                           / "idle.json"))


def test_an_idle_h200s_conditions_by_default_and_unsupported_where_the_driver_says_so(lib_dir, scenario):
    fakenvml.write_scenario(scenario, {"gpus": [{}, {"power": None, "reasons": None, "sm_clock": 1500}]})
    out = run_json(lib_dir, scenario, """
        N.nvmlInit()
        out = []
        for i in range(2):
            h = N.nvmlDeviceGetHandleByIndex(i)
            calls = {"clock_sm": lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM),
                     "clock_graphics": lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_GRAPHICS),
                     "clock_mem": lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM),
                     "clock_video": lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_VIDEO),
                     "event_reasons": lambda: hex(N.nvmlDeviceGetCurrentClocksEventReasons(h)),
                     "throttle_reasons": lambda: hex(N.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
                     "temperature_gpu": lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU),
                     "power_mw": lambda: N.nvmlDeviceGetPowerUsage(h),
                     "fan_speed": lambda: N.nvmlDeviceGetFanSpeed(h)}
            got = {}
            for name, fn in calls.items():
                try:
                    got[name] = fn()
                except N.NVMLError as e:
                    got[name] = "NVMLError: %s (%d)" % (e, e.value)
            out.append(got)
        print(json.dumps(out))
    """)
    idle, other = out
    assert idle == {k: H200_IDLE[k] for k in idle}  # the recorded answers, NOT_SUPPORTED fan included
    assert other["power_mw"] == other["event_reasons"] == other["throttle_reasons"] == "NVMLError: Not Supported (3)"
    assert other["clock_sm"] == other["clock_graphics"] == 1500


def test_a_process_appears_while_nvml_is_held_open(lib_dir, scenario):
    fakenvml.write_scenario(scenario, {"gpus": [{}]})
    out = run_json(lib_dir, scenario, f"""
        import sys
        sys.path.insert(0, {str(fakenvml.SOURCE_DIR.parent.parent)!r})
        from tests.harness import fakenvml
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        before = procs(N.nvmlDeviceGetComputeRunningProcesses(h))
        fakenvml.write_scenario({str(scenario)!r}, {{"gpus": [{{"power": 668000, "processes": [
            {{"pid": 4242, "mem": 1 << 30, "pidns": None}}]}}]}})
        after = procs(N.nvmlDeviceGetComputeRunningProcesses(h))
        used = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2).used
        print(json.dumps([before, after, used, N.nvmlDeviceGetPowerUsage(h)]))
    """)
    assert out == [[], [[4242, 1 << 30, 0xFFFFFFFF, 0xFFFFFFFF]], 1 << 30, 668000]
