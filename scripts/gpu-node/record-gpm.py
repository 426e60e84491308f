"""Run on a real GPU node, as root, by record-gpm.sh: what NVML answers a live look, recorded raw
(no fleet in between) for the fake NVML (tests/fakenvml) to replay: GPM metrics (Hopper and
newer), the plain utilization, memory, clocks, power and the process lists, once a second, while
the GPU is idle, while another user's GEMM loop runs, while that user only holds memory, and
while ncu profiles. Also the sampler's own CPU time per sample.

    python3 record-gpm.py PHASE SECONDS OUT.json   (appends one phase to OUT.json)
"""

from __future__ import annotations

import json
import os
import sys
import time

import pynvml as nv

METRICS = {"graphics_util": 1, "sm_util": 2, "sm_occupancy": 3, "integer_util": 4, "any_tensor_util": 5,
           "dram_bw_util": 10, "fp64_util": 11, "fp32_util": 12, "fp16_util": 13,
           "pcie_tx_per_sec": 20, "pcie_rx_per_sec": 21}


def _try(fn):
    try:
        return fn()
    except nv.NVMLError as e:
        return {"nvml_error": str(e)}


def gpm_metrics(h, s1, s2):
    req = nv.c_nvmlGpmMetricsGet_t()
    req.version = nv.NVML_GPM_METRICS_GET_VERSION
    req.numMetrics = len(METRICS)
    req.sample1, req.sample2 = s1, s2
    for i, mid in enumerate(METRICS.values()):
        req.metrics[i].metricId = mid
    nv.nvmlGpmMetricsGet(req)
    return {name: {"id": req.metrics[i].metricId, "return": int(req.metrics[i].nvmlReturn),
                   "value": req.metrics[i].value} for i, name in enumerate(METRICS)}


def one_gpu(h):
    mem = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    util = _try(lambda: nv.nvmlDeviceGetUtilizationRates(h))
    procs = _try(lambda: nv.nvmlDeviceGetComputeRunningProcesses(h))
    samples = _try(lambda: nv.nvmlDeviceGetProcessUtilization(h, 0))
    return {"memory_used_v2": mem.used, "memory_reserved_v2": mem.reserved, "memory_total": mem.total,
            "utilization": {"gpu": util.gpu, "memory": util.memory} if not isinstance(util, dict) else util,
            "power_mw": _try(lambda: nv.nvmlDeviceGetPowerUsage(h)),
            "sm_clock_mhz": _try(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            "clock_reasons": _try(lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h)),
            "temperature_c": _try(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            "compute_processes": procs if isinstance(procs, dict) else
            [{"pid": p.pid, "used_memory": p.usedGpuMemory} for p in procs],
            "sampled_pids": samples if isinstance(samples, dict) else sorted({s.pid for s in samples})}


def main(phase, seconds, out):
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    doc = json.load(open(out)) if os.path.exists(out) else {
        "driver": nv.nvmlSystemGetDriverVersion(), "nvml": nv.nvmlSystemGetNVMLVersion(),
        "cuda_driver": nv.nvmlSystemGetCudaDriverVersion(), "gpu": nv.nvmlDeviceGetName(h),
        "architecture": nv.nvmlDeviceGetArchitecture(h),
        "gpm_supported": nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice,
        "binding": "nvidia-ml-py (pynvml %s)" % getattr(nv, "__version__", "?"), "uid": os.getuid(),
        "phases": {}}
    s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    nv.nvmlGpmSampleGet(h, s1)
    rows, cpu = [], []
    for _ in range(int(seconds)):
        time.sleep(1.0)
        c0 = time.process_time()
        nv.nvmlGpmSampleGet(h, s2)
        row = {"t": time.time(), "gpm": gpm_metrics(h, s1, s2), **one_gpu(h)}
        cpu.append(time.process_time() - c0)
        rows.append(row)
        s1, s2 = s2, s1
    doc["phases"][phase] = {"samples": rows, "sampler_cpu_s_per_sample": cpu}
    with open(out + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(out + ".tmp", out)
    print(phase, "util", [r["utilization"] for r in rows][-1], "sm_util",
          round(rows[-1]["gpm"]["sm_util"]["value"], 1), "occupancy", round(rows[-1]["gpm"]["sm_occupancy"]["value"], 1),
          "cpu/sample ms", round(1000 * sum(cpu) / len(cpu), 2), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3])
