"""The workload's container: the words that put it there, with the least privilege the plan needs.

Pure text. In every kind the node's Nsight install is mounted read-only at the
same path, so the profiler inside is the node's own, and the report directory
is mounted at the same path, so the report lands where the agent looks.

- pyxis and Apptainer (Slurm): the task runs in the image as the user; no privilege is added,
  so CPU sampling and GPU counters are what the node allows that user.
- Docker (lab servers): what :func:`fleet.policy.docker_privileges` grants, rendered: a
  seccomp profile for CPU sampling, SYS_ADMIN only for GPU counters, never ``--privileged``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import exitcodes
from ..errors import FleetError
from ..policy import DockerPrivileges
from ..safenames import UnsafeValue


class ContainerError(FleetError, ValueError):
    """A container that cannot be rendered as asked."""

    # as the Slurm and nightly paths have ended on it (exitcodes.of_error)
    exit_status = exitcodes.FAILED


def image_problem(image: str, option: str) -> str | None:
    """Why ``image`` cannot name a container image: an option (``--privileged``) would be read as
    one by docker, apptainer or srun; a control character or a blank is no image reference."""
    if not image or image.startswith("-"):
        return f"{option} {image!r}: an image name, not an option (it would reach docker as one)"
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in image):
        return f"{option} {image!r}: an image name has no blanks or control characters"
    return None


@dataclass(frozen=True)
class Container:
    kind: str                           # pyxis | apptainer | docker
    image: str
    nsight_dirs: tuple[str, ...] = ()   # the node's Nsight installs (from nsys_path / ncu_path)


def nsight_dirs(tools: dict) -> tuple[str, ...]:
    """The install folder of each profiler path (…/nsight-systems-2025.3/bin/nsys →
    …/nsight-systems-2025.3). Nsight Compute's own installer puts ``ncu`` at the top of its folder
    (…/nsight-compute/2025.3.1/ncu), the CUDA toolkit in ``bin/``
    (/usr/local/cuda/bin/ncu → /usr/local/cuda)."""
    dirs = []
    for name, path in tools.items():
        parent = os.path.dirname(path)
        if name != "ncu" or os.path.basename(parent) == "bin":
            parent = os.path.dirname(parent)
        if parent not in ("", "/", "/usr", "/usr/local") and parent not in dirs:
            dirs.append(parent)
    return tuple(dirs)


def mount_path(path: str, what: str) -> str:
    """``path`` for a mount list: pyxis's --container-mounts and Apptainer's --bind split on commas
    and colons, docker's -v on colons, so a path holding one would be read as another mount (a host
    folder mounted elsewhere)."""
    if "," in path or ":" in path:
        raise UnsafeValue(f"{what} {path!r}: a comma or colon would split it into "
                          "other mounts in the container")
    return path


def slurm_words(c: Container | None, run_dir: str, scratch: str | None = None) -> list[str]:
    """srun options (pyxis) or a command prefix (apptainer) that put a Slurm task in the container,
    with the run directory (and the node-local scratch the ranks write to, if
    any) mounted read-write."""
    if c is None:
        return []
    written = [mount_path(run_dir, "the run directory")] + ([mount_path(scratch, "slurm_scratch")]
                                                            if scratch else [])
    for d in c.nsight_dirs:
        mount_path(d, "the Nsight install (nsys_path / ncu_path)")
    if c.kind == "pyxis":
        mounts = [f"{d}:{d}" for d in written] + [f"{d}:{d}:ro" for d in c.nsight_dirs]
        return [f"--container-image={c.image}", "--container-mounts=" + ",".join(mounts)]
    if c.kind == "apptainer":
        binds = [w for d in written for w in ("--bind", d)] + [
            w for d in c.nsight_dirs for w in ("--bind", f"{d}:{d}:ro")]
        return ["apptainer", "exec", "--nv", *binds, c.image]
    raise ContainerError(f"a Slurm task runs in a pyxis or Apptainer container, not {c.kind!r}")


def docker_run(c: Container, report_dir: str, *, user: str, gpus: tuple[str, ...] | None,
               privileges: DockerPrivileges) -> list[str]:
    """``docker run`` words before the profiler's own argv (lab servers), as the node's user
    (``UID:GID``), so that reports belong to them, with what the policy granted
    (:func:`fleet.policy.docker_privileges`); ``gpus`` are UUIDs, None for all."""
    if c.kind != "docker":
        raise ContainerError(f"a lab server's workload runs in a Docker container, not {c.kind!r}")
    # --gpus takes a CSV list: several devices need the value itself in double quotes.
    words = ["docker", "run", "--rm", "--init", "--user", user,
             "--gpus", "all" if gpus is None else '"device=' + ",".join(gpus) + '"',
             "-v", f"{mount_path(report_dir, 'the report directory')}:{report_dir}"]
    for d in c.nsight_dirs:  # docker's -v splits on colons
        words += ["-v", f"{mount_path(d, 'the Nsight install (nsys_path / ncu_path)')}:{d}:ro"]
    if privileges.seccomp_profile:
        words += ["--security-opt", f"seccomp={privileges.seccomp_profile}"]
    if privileges.cap_sys_admin:
        words += ["--cap-add", "SYS_ADMIN"]
    return words + [c.image]

