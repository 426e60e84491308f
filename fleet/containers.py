"""The workload's container: the words that put it there, with the least privilege the plan needs.

Pure text. In every kind the node's Nsight install is mounted read-only at the
same path, so the profiler inside is the node's own, and the report directory
is mounted at the same path, so the report lands where the agent looks.

- pyxis and Apptainer (Slurm): the task runs in the image as the user; no privilege is added,
  so CPU sampling and GPU counters are what the node allows that user.
- Docker (lab servers): nothing extra for a trace; for CPU sampling, a seccomp profile that
  allows ``perf_event_open`` (Docker's default profile refuses it without CAP_SYS_ADMIN or
  CAP_PERFMON), never ``--cap-add SYS_ADMIN`` for that; SYS_ADMIN only for GPU counters (ncu,
  GPU metrics); never ``--privileged``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


class ContainerError(ValueError):
    """A container that cannot be rendered as asked."""


@dataclass(frozen=True)
class Container:
    kind: str                           # pyxis | apptainer | docker
    image: str
    nsight_dirs: tuple[str, ...] = ()   # the node's Nsight installs (from nsys_path / ncu_path)


def nsight_dirs(tools: dict) -> tuple[str, ...]:
    """The install folder of each profiler path (…/nsight-systems-2025.3/bin/nsys → …/nsight-systems-2025.3)."""
    dirs = []
    for path in tools.values():
        parent = os.path.dirname(os.path.dirname(path))
        if parent not in ("", "/", "/usr", "/usr/local") and parent not in dirs:
            dirs.append(parent)
    return tuple(dirs)


def slurm_words(c: Container | None, run_dir: str) -> list[str]:
    """srun options (pyxis) or a command prefix (apptainer) that put a Slurm task in the container."""
    if c is None:
        return []
    if c.kind == "pyxis":
        mounts = [f"{run_dir}:{run_dir}"] + [f"{d}:{d}:ro" for d in c.nsight_dirs]
        return [f"--container-image={c.image}", "--container-mounts=" + ",".join(mounts)]
    if c.kind == "apptainer":
        binds = [w for d in c.nsight_dirs for w in ("--bind", f"{d}:{d}:ro")]
        return ["apptainer", "exec", "--nv", "--bind", run_dir, *binds, c.image]
    raise ContainerError(f"a Slurm task runs in a pyxis or Apptainer container, not {c.kind!r}")


def docker_run(c: Container, report_dir: str, *, user: str, gpus: tuple[str, ...] | None, cpu_sampling: bool,
               counters: bool, seccomp_profile: str | None) -> list[str]:
    """``docker run`` words before the profiler's own argv (lab servers), as the node's user
    (``UID:GID``), so that reports belong to them. ``cpu_sampling`` is asked only with
    ``seccomp_profile`` (the caller gives sampling up otherwise); ``gpus`` are UUIDs, None for all."""
    if c.kind != "docker":
        raise ContainerError(f"a lab server's workload runs in a Docker container, not {c.kind!r}")
    # --gpus takes a CSV list: several devices need the value itself in double quotes.
    words = ["docker", "run", "--rm", "--init", "--user", user,
             "--gpus", "all" if gpus is None else '"device=' + ",".join(gpus) + '"',
             "-v", f"{report_dir}:{report_dir}"]
    for d in c.nsight_dirs:
        words += ["-v", f"{d}:{d}:ro"]
    if cpu_sampling:
        if not seccomp_profile:
            raise ContainerError("CPU sampling in Docker needs a seccomp profile that allows perf_event_open")
        words += ["--security-opt", f"seccomp={seccomp_profile}"]
    if counters:
        words += ["--cap-add", "SYS_ADMIN"]  # GPU performance counters: the one capability they need
    return words + [c.image]

