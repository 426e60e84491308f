"""A script run against the fake NVML through the real pynvml binding, in a fresh interpreter
(pynvml loads libnvidia-ml.so.1 once per process, and LD_LIBRARY_PATH is only read at process start)."""

import json
import os
import subprocess
import sys
import textwrap

from tests.harness import fakenvml

# Prepended to every script: pynvml plus a helper naming the NVMLError raised.
PRELUDE = """
import ctypes, json, os, sys
import pynvml as N

def err(fn, *args):
    try:
        fn(*args)
    except N.NVMLError as e:
        return type(e).__name__
    return None

def procs(lst):
    return [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId] for p in lst]
"""


def run(lib_dir, scenario_path, body, extra_env=None):
    env = {**os.environ, **fakenvml.env(lib_dir, scenario_path), **(extra_env or {})}
    script = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True, timeout=60)


def run_json(lib_dir, scenario_path, body):
    """Run a script whose last stdout line is JSON; fail with its stderr if it crashed."""
    proc = run(lib_dir, scenario_path, body)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])
