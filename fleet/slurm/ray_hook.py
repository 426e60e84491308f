"""fleet's Ray hook: Ray's own nsys integration for a Ray program, with no change to its code.

Not imported by fleet. Ray (2.60: ``ray._private.worker._maybe_modify_runtime_env``) calls
``RAY_RUNTIME_ENV_HOOK=fleet_ray_hook.runtime_env_hook`` from the program's ``ray.init``, with the
program's runtime_env (merged with a submitted job's), and uses what it returns. Two ways in:

- a Slurm job: the job script writes this file, as ``fleet_ray_hook.py``, into the run's ``ray/``
  folder beside ``fleet_ray_hook.json`` (the ``_nsight`` block), with that folder on ``PYTHONPATH``;
- ``fleet ray submit``: the job's runtime_env carries this file in ``py_modules`` (Ray uploads it
  to every node) and the hook and the block in ``env_vars``, so the job's driver calls the hook.

The hook adds ``_nsight``, so that Ray starts each worker under nsys (``nsys profile ... python``;
its plugin, ``ray/_private/runtime_env/nsight.py``, names the report only by the ``o`` option:
fleet's ``worker-%h-%p``, host and pid), and a ``worker_process_setup_hook`` that, in each
worker, writes whose it is once the worker knows: the actor's class and name or the task's
function, its node, its GPUs and its pid, as ``worker-HOST-PID.whose.json`` beside the report.

How it gives ``_nsight`` to the chosen actors alone and ends the program's actors before Ray's
shutdown would kill their nsys: docs/architecture.md, "The Ray hook".
"""

import atexit
import fnmatch
import json
import os
import socket
import stat
import sys
import threading
import time
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
# {"_nsight": {...}} as JSON; else fleet_ray_hook.json beside this file
BLOCK_ENV = "FLEET_RAY_RUNTIME_ENV"
# a JSON list of fnmatch patterns: the actors to profile; unset: every worker
ACTORS_ENV = "FLEET_RAY_ACTORS"
LOOK_EVERY = 0.05  # seconds between looks for the actor or task a worker runs
LOOK_FOR = 3600.0  # a worker that runs nothing for an hour is named by its host and pid alone
# seconds an actor's class is waited for (its constructor runs meanwhile), then it is left out
CLASS_WAIT = 60.0
# seconds kept before the job's time limit (FLEET_JOB_END), as the job's wait keeps them
JOB_END_MARGIN = 5.0
# How long, in all, the program's end waits for its actors still alive to end gracefully (each
# worker's exit: its atexit handlers, Ray's disconnect; under a second each, all at once), before
# Ray's shutdown kills what is left; less where the job's time limit is nearer. Short: an actor busy
# with a task ends only after it (tasks Ray would have killed run on), and one that never
# finishes costs every exit this.
END_ACTORS_WITHIN = 10.0
ENDED_EVERY = 0.1  # seconds between looks at whether the actors ended

# actor id (hex) -> its handle, of those under nsys, while the program holds it
_created = weakref.WeakValueDictionary()


def _block():
    said = os.environ.get(BLOCK_ENV)
    if said:
        return json.loads(said)["_nsight"]
    with open(os.path.join(HERE, "fleet_ray_hook.json")) as f:
        return json.load(f)["_nsight"]


def _patterns():
    said = os.environ.get(ACTORS_ENV)
    return [p for p in json.loads(said) if isinstance(p, str)] if said else []


def chosen(name, patterns):
    """Whether the actor named ``name`` is one to profile."""
    return not patterns or (isinstance(name,
                                       str) and any(fnmatch.fnmatchcase(name, p) for p in patterns))


def runtime_env_hook(runtime_env):
    """The program's runtime_env with fleet's ``_nsight`` (its output names are fleet's, to find
    the reports), or only the chosen actors', and the worker hook; the
    program's own keys are kept."""
    env = dict(runtime_env or {})
    block, patterns = dict(_block()), _patterns()
    # fleet ray submit's default: ~ of the user Ray runs as, here
    block["o"] = os.path.expanduser(block["o"])
    private_folder(os.path.dirname(block["o"]))  # refused before the program starts
    env_vars = dict(env.get("env_vars") or {})
    env_vars.setdefault("PYTHONPATH",
                        os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
    env_vars[BLOCK_ENV] = json.dumps({"_nsight": block})  # the workers' folder, on any node
    env_vars.setdefault("PATH", _python_first())
    if patterns:
        env_vars.setdefault(ACTORS_ENV, json.dumps(patterns))
    else:
        env["_nsight"] = block
    _watch_actors(patterns, block)
    env["env_vars"] = env_vars
    env.setdefault("worker_process_setup_hook", "fleet_ray_hook.in_worker")
    return env


def _python_first():
    """PATH with this program's own Python first as ``python``. Ray's nsight plugin starts each
    worker as ``nsys profile ... python``, whatever Python the program runs on: where PATH's
    ``python`` is another one (a batch job's PATH, /usr/bin's), every worker fails to import ray,
    Ray starts it again and again, and the program waits for its actors forever."""
    folder = os.path.dirname(sys.executable)
    found = os.path.join(folder, "python")
    if not (os.path.exists(found) and os.path.samefile(found, sys.executable)):
        # a folder of fleet's, with ``python`` this Python
        folder = os.path.join(HERE, "python-bin")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not os.path.lexists(os.path.join(folder, "python")):
            os.symlink(sys.executable, os.path.join(folder, "python"))
    return os.pathsep.join(p for p in (folder, os.environ.get("PATH")) if p)


def _watch_actors(patterns, block):
    """An actor created with a name that matches the patterns gets ``_nsight`` in its own
    runtime_env (Ray merges it over the job's), the others none; without patterns all run under the
    job's. Each is remembered weakly (Ray still ends one the program dropped), to be ended at
    its end (end_actors)."""
    from ray.actor import ActorClass
    from ray._private.utils import parse_runtime_env_for_task_or_actor

    create = ActorClass._remote
    if getattr(create, "fleet_ray_hook", False):
        return

    def _remote(self, args=None, kwargs=None, **options):
        profiled = chosen(options.get("name"), patterns)
        if patterns and profiled:
            own = dict(options.get("runtime_env") or {})
            own["_nsight"] = block
            options["runtime_env"] = parse_runtime_env_for_task_or_actor(own)
        handle = create(self, args, kwargs, **options)
        # Not a detached actor (it outlives the job by design), nor one get_if_exists may have found
        # (another job's), nor what is no actor handle as Ray 2.60 makes one.
        actor = _try(lambda: handle._actor_id.hex())
        if (actor and profiled and options.get("lifetime") != "detached"
            and not options.get("get_if_exists")):
            _created[actor] = handle
        return handle

    _remote.fleet_ray_hook = True
    ActorClass._remote = _remote
    # after Ray's shutdown was registered (at import ray): run before it
    atexit.register(end_actors)
    _end_actors_before_shutdown()


def _end_actors_before_shutdown():
    """The program's own ``ray.shutdown()`` kills its actors' workers as Ray's atexit one does: the
    actors ended first here too (Ray's atexit handler holds its own ``shutdown``, not this one)."""
    import ray

    shutdown = ray.shutdown

    def _shutdown(*args, **kwargs):
        try:
            end_actors()
        finally:  # even interrupted (Ctrl-C in the wait), Ray shuts down as asked
            shutdown(*args, **kwargs)

    ray.shutdown = _shutdown


def end_actors(bound=END_ACTORS_WITHIN):
    """At the program's end, before Ray's shutdown: each actor it created that runs under nsys and
    is still alive, and not detached, ended gracefully, and waited for (its worker's exit, where its
    node is this one), up to ``bound`` seconds in all (less near the job's time limit). Ray's GCS is
    asked in a thread of its own: one that does not answer (its head gone) is waited on no longer
    than that. The ids of those still alive then (Ray's shutdown kills them, nsys with them)."""
    end = os.environ.get("FLEET_JOB_END", "")
    bound = max(0.0, min(bound, float(end) - time.time() - 2
                         * JOB_END_MARGIN)) if end.isdigit() else bound
    left = []
    asking = threading.Thread(target=lambda: left.extend(_end_actors(bound)), daemon=True)
    asking.start()
    asking.join(bound + 1.0)
    if asking.is_alive():
        print("fleet: Ray's GCS did not answer within %d s: Ray's shutdown goes on" % bound,
              file=sys.stderr)
    return sorted(left)


def _end_actors(bound):
    deadline = time.monotonic() + bound
    try:
        import ray
        from ray._private import state

        if not ray.is_initialized():
            return []
        ending = _terminate(state, _try(lambda: ray.get_runtime_context().get_node_id()))
        if ending:
            print("fleet: ending the Ray program's %d actors still alive under nsys before Ray's "
                  "shutdown, as Ray documents a graceful end, so that nsys writes their reports "
                  "(up to %d s)" % (len(ending), bound),
                  file=sys.stderr, flush=True)
        while ending and time.monotonic() < deadline:
            ending = {a: pid for a, pid in ending.items() if not _ended(state, a, pid)}
            if ending:
                time.sleep(ENDED_EVERY)
        if ending:
            print("fleet: after %d s %d Ray actors still ran: Ray's shutdown kills them, and their "
                  "nsys with them"
                  % (bound, len(ending)), file=sys.stderr, flush=True)
        return sorted(ending)
    except Exception as e:  # Ray's own shutdown still runs; the program's log says why, in one line
        print("fleet: the Ray program's actors were not ended before Ray's shutdown: %s" % e,
              file=sys.stderr)
        return []


def _terminate(state, here):
    """Each actor the program made, alive and not detached, asked to end (Ray's graceful end):
    actor id -> its worker's pid where it runs on this node (``here``), else None."""
    ending = {}
    for actor, handle in list(_created.items()):
        info = _try(lambda: state.actors(actor_id=actor))
        if not info or info.get("IsDetached") or info.get("State") != "ALIVE":
            continue
        try:
            handle.__ray_terminate__.remote()
        except Exception:  # Ray refused the call: its shutdown ends the actor, as it would have
            continue
        node = (info.get("Address") or {}).get("NodeID")
        ending[actor] = info.get("Pid") if node and node == here else None
    return ending


def _ended(state, actor, pid):
    """Whether the actor is dead in Ray's GCS and, where its worker runs here, its process has
    exited (its parent, nsys, then writes the report: Ray's shutdown leaves it; until
    then it would kill it)."""
    info = _try(lambda: state.actors(actor_id=actor))
    if info and info.get("State") != "DEAD":
        return False
    return not pid or not _running(pid)


def _running(pid):
    """Whether the process ``pid`` runs (exists, and is no zombie awaiting its parent's wait)."""
    return _stat(pid)[:1] not in ([], ["Z"])


def _stat(pid):
    """The fields of ``/proc/PID/stat`` after the command's name, its state first; [] for none."""
    try:
        with open("/proc/%s/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def in_worker():
    """In each Ray worker, at its start: whose the worker is, written once it
    runs an actor or a task."""
    threading.Thread(target=_record, name="fleet-whose", daemon=True).start()


def _record():
    import ray

    started = time.monotonic()
    while time.monotonic() - started < LOOK_FOR:
        ctx = _try(ray.get_runtime_context)
        actor = _try(ctx.get_actor_id) if ctx else None
        task = _try(ctx.get_task_name) if ctx else None
        # The actor's id is set before its instance is made: its class comes soon after.
        waiting = actor and _actor_class() is None and time.monotonic() - started < CLASS_WAIT
        if (actor or task) and not waiting:
            _say_whose(ray, ctx, actor, task)
            return
        time.sleep(LOOK_EVERY)


def _say_whose(ray, ctx, actor, task):
    """The worker's whose-file, where it is profiled (an actor the --ranks
    patterns choose, or any)."""
    name = _try(ctx.get_actor_name) if actor else None
    patterns = _patterns()
    if patterns and not (actor and chosen(name, patterns)):
        return  # not profiled: no report to say whose it is
    try:
        _write({"pid": os.getpid(), "nsys_pid": _nsys_parent(), "host": socket.gethostname(),
                "node_id": _try(ctx.get_node_id),
                "actor_id": actor, "actor_name": name,
                "actor_class": _actor_class() if actor else None, "task": None if actor else task,
                "gpu_ids": [str(g) for g in _try(ray.get_gpu_ids) or []],
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
    except OSError as e:  # the worker's log says why; its report is named by host and pid alone
        print(e, file=sys.stderr)


def _nsys_parent():
    """The pid of the nsys that started this worker (its parent, ``nsys profile``), or None."""
    parent = os.getppid()
    return parent if b"profile" in _argv(parent) else None


def _argv(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


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


def _reports_dir():
    """Where nsys writes this worker's report (the block's ``o``), made here when it is not yet
    there (nsys writes the report when the worker ends, long after this), private."""
    return private_folder(os.path.dirname(_try(lambda: _block()["o"]) or "") or HERE)


def private_folder(folder):
    """The run's ``ray/``, made 0700 (and the run's folder) where missing; refused, naming the
    folder, unless every folder from it up to / holds as the head's check holds them
    (fleet/ray/submit.py; docs/architecture.md, "The Ray hook": another account
    could swap ``ray/``)."""
    run = os.path.dirname(folder)
    _links_held(folder)
    _walk_up(run, 1, made=False)  # before anything is made in another's folder
    _try(lambda: os.makedirs(run, 0o700))  # the run's folder, with what it needs
    _walk_up(run, 1)
    _try(lambda: os.mkdir(folder, 0o700))  # ray/ made once its parent holds
    _walk_up(folder, 0)
    return folder


def _links_held(path):
    """Each link on ``path`` as given is root's or this user's: another's could be pointed elsewhere
    once the folders it leads to were checked (the walk checks where links
    lead, as they lead now)."""
    path = os.path.abspath(path)
    while path != "/":
        st = _try(lambda: os.lstat(path))
        if st is not None and stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.geteuid()):
            raise OSError("fleet: refusing the Ray run's folder: %s is a link of uid %d, who could "
                          "point it elsewhere" % (path, st.st_uid))
        path = os.path.dirname(path)


def _walk_up(path, level, made=True):
    """``path``, ``level`` folders above ``ray/``, and each above it: ray/ this user's and closed,
    the run's folder this user's and no one else's to write, each above that too, or root's where
    no account may rename what is not its own (/tmp: sticky). ``made``: False before the folders
    are made, when one not yet there is passed over."""
    # not followed
    path = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    while True:
        st = _try(lambda: os.lstat(path)) or os.stat_result((0,) * 10)
        mode = st.st_mode & 0o7777
        rooted = level >= 2 and st.st_uid == 0 and not (mode & 0o002 and not mode & 0o1000)
        mine = st.st_uid == os.geteuid() and not mode & (0o077 if level == 0 else 0o022)
        if (made or os.path.lexists(path)) and not (stat.S_ISDIR(st.st_mode) and (rooted or mine)):
            raise OSError("fleet: refusing the Ray run's folder: %s is not this user's (or root's, "
                          "above the run's folder), or another account may write in it (uid %d, "
                          "mode %o)" % (path, st.st_uid, mode))
        if path in ("/", ""):
            return
        path, level = os.path.dirname(path), level + 1


def _write(doc):
    path = os.path.join(_reports_dir(),
                        "worker-%s-%d.whose.json" % (socket.gethostname(), os.getpid()))
    partial = path + ".partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(partial, path)
