"""fleet's Ray hook: Ray's own nsys integration for a Ray program, with no change to its code.

Not imported by fleet: the job script writes this file, as ``fleet_ray_hook.py``, into the run's
``ray/`` folder beside ``fleet_ray_hook.json`` (the ``_nsight`` block), and exports
``RAY_RUNTIME_ENV_HOOK=fleet_ray_hook.runtime_env_hook`` with that folder on ``PYTHONPATH``. Ray
(2.60: ``ray._private.worker._maybe_modify_runtime_env``) calls the hook from ``ray.init`` with the
program's runtime_env and uses what it returns: fleet adds ``_nsight`` there, so that Ray starts
every worker under nsys (``nsys profile ... python``; its plugin,
``ray/_private/runtime_env/nsight.py``, names the report only by the ``o`` option: fleet's
``worker-%h-%p``, host and pid), and a ``worker_process_setup_hook`` that, in each worker, writes
whose it is once the worker knows: the actor's class and name or the task's function, its node,
its GPUs and its pid, as ``worker-HOST-PID.whose.json`` beside the report.

Runs in the Ray program's and its workers' Python: the standard library, and Ray.
"""

import json
import os
import socket
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LOOK_EVERY = 0.05  # seconds between looks for the actor or task a worker runs
LOOK_FOR = 3600.0  # a worker that runs nothing for an hour is named by its host and pid alone


def _block():
    with open(os.path.join(HERE, "fleet_ray_hook.json")) as f:
        return json.load(f)["_nsight"]


def runtime_env_hook(runtime_env):
    """The program's runtime_env with fleet's ``_nsight`` (its output names are fleet's, to find
    the reports) and the worker hook; the program's own keys are kept."""
    env = dict(runtime_env or {})
    env["_nsight"] = _block()
    env.setdefault("worker_process_setup_hook", "fleet_ray_hook.in_worker")
    env_vars = dict(env.get("env_vars") or {})
    env_vars.setdefault("PYTHONPATH", os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
    env["env_vars"] = env_vars
    return env


def in_worker():
    """In each Ray worker, at its start: whose the worker is, written once it runs an actor or a task."""
    threading.Thread(target=_record, name="fleet-whose", daemon=True).start()


def _record():
    import ray

    started = time.monotonic()
    while time.monotonic() - started < LOOK_FOR:
        ctx = _try(ray.get_runtime_context)
        actor = _try(ctx.get_actor_id) if ctx else None
        task = _try(ctx.get_task_name) if ctx else None
        if actor or task:
            _write({"pid": os.getpid(), "host": socket.gethostname(), "node_id": _try(ctx.get_node_id),
                    "actor_id": actor, "actor_name": _try(ctx.get_actor_name) if actor else None,
                    "actor_class": _actor_class() if actor else None, "task": None if actor else task,
                    "gpu_ids": [str(g) for g in _try(ray.get_gpu_ids) or []],
                    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
            return
        time.sleep(LOOK_EVERY)


def _actor_class():
    """The class of the actor this worker holds (Ray keeps the instance in its worker object)."""
    import ray

    held = getattr(getattr(ray, "_private").worker.global_worker, "actors", None) or {}
    return next((type(instance).__name__ for instance in held.values()), None)


def _try(call):
    try:
        return call()
    except Exception:
        return None


def _write(doc):
    path = os.path.join(HERE, "worker-%s-%d.whose.json" % (socket.gethostname(), os.getpid()))
    partial = path + ".partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(partial, path)
