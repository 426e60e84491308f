"""Playbooks: named reference workloads to profile on a schedule, and what to track in them.

One YAML file per playbook (``playbooks/*.yaml``), checked on load: every
error names the file and line. A playbook becomes an ordinary profile request
(lab hosts, or a Slurm job shape), so a nightly run is a normal run: gathered,
verified and catalogued, with its metrics read from the ``nsys stats``
summaries fleet keeps beside each report.
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import safenames
from . import environment
from ..errors import FleetError
from ..inventory import read_yaml
from ..userflags import profiler_args_error
from ..safenames import UnsafeValue
from ..slurm import options as slurm_options
from ..slurm.launchers import LAUNCHERS
from .summary_rows import NcuPage, SummaryRow, csv_rows, summary_rows

if TYPE_CHECKING:
    from ..store.manifest import RunManifest

METRIC_KINDS = ("gpu_kernel_total", "kernel", "top_kernels", "nvtx", "ncu")
TARGET_KEYS = {"partition": str, "cluster": str, "hosts": str, "nodes": int, "ntasks": int,
               "ntasks_per_node": int, "gpus": str, "gres": str, "time": str, "account": str,
               "qos": str, "ranks": list, "launcher": str}
PLAYBOOK_KEYS = {"name", "target", "command", "tool", "profiler_args", "metrics", "thresholds",
                 "description", "ranks", "version", "checkout"}
# how `fleet reports ranks` finds the syncs and steps;
RANKS_KEYS = ("sync_range", "sync_call", "step_range", "record")
# record: a `fleet top --record` file kept running beside the nightly runs
# (the node's record of each)
METRIC_KEYS = {"kind", "name", "count", "kernel"}
DEFAULT_THRESHOLDS = {"regression": 0.10, "suspicious": 0.05, "consecutive": 2, "baseline_runs": 7,
                      "min_runs": 3,
                      # change: the least relative shift a change point may be (docs/nightly.md)
                      "change": 0.02}


class PlaybookError(FleetError, ValueError):
    """A malformed playbook; ``str()`` reads ``file:line: what is wrong``."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where, self.message = where, message


@dataclass(frozen=True)
class Metric:
    kind: str
    name: str | None = None      # kernel / nvtx: a glob on the name; ncu: the metric
    count: int = 5               # top_kernels
    kernel: str = "*"            # ncu: the kernels (a glob) whose values are summed

    @property
    def label(self) -> str:
        if self.kind == "ncu":
            return f"ncu {self.name}" + ("" if self.kernel == "*" else f" of {self.kernel}")
        return {"gpu_kernel_total": "total GPU kernel time",
                "top_kernels": f"top {self.count} kernels' time",
                }.get(self.kind, f"{self.kind} {self.name}")


@dataclass(frozen=True)
class Playbook:
    name: str
    path: str
    command: tuple[str, ...]
    target: dict[str, Any]
    tool: str = "nsys"
    profiler_args: tuple[str, ...] = ()
    metrics: tuple[Metric, ...] = (Metric("gpu_kernel_total"),)
    thresholds: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    # the straggler share's sync_range, sync_call, step_range
    ranks: dict[str, str] = field(default_factory=dict)
    # a command whose first line of output is the workload's version (docs/nightly.md)
    version: tuple[str, ...] = ()
    # a command that puts the workload at the version given as its last word (confirm)
    checkout: tuple[str, ...] = ()

    @property
    def on_slurm(self) -> bool:
        return "partition" in self.target or "cluster" in self.target


def _fail(path: Path, doc: Any, key: Any, message: str) -> PlaybookError:
    line = doc.line_of(key) if hasattr(doc, "line_of") and key in doc else getattr(doc, "line",
                                                                                   None) or 1
    return PlaybookError(f"{path}:{line}", message)


def _unknown(what: str, key: Any, known) -> str:
    """``unknown key 'metric' (did you mean 'metrics'?)``, or the known keys
    when nothing is close."""
    close = difflib.get_close_matches(str(key), sorted(known), n=1)
    return f"unknown {what} {key!r} " + (f"(did you mean {close[0]!r}?)" if close else
                                         f"(known: {', '.join(sorted(known))})")


def _metric(path: Path, i: int, m: Any, where: Any) -> Metric:
    if not isinstance(m, dict) or m.get("kind") not in METRIC_KINDS:
        raise PlaybookError(f"{path}:{getattr(m, 'line', getattr(where, 'line', 1))}",
                            f"metrics[{i}]: kind must be one of {', '.join(METRIC_KINDS)}")
    for key in m:
        if key not in METRIC_KEYS:
            raise _fail(path, m, key, f"metrics[{i}]: " + _unknown("key", key, METRIC_KEYS))
    if m["kind"] in ("kernel", "nvtx", "ncu") and not isinstance(m.get("name"), str):
        raise _fail(path, m, "kind", f"metrics[{i}]: a {m['kind']} metric needs name "
                                     f"({'an ncu metric' if m['kind'] == 'ncu' else 'a glob'})")
    count = m.get("count", 5)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise _fail(path, m, "count",
                    f"metrics[{i}].count: must be a whole number of kernels, 1 or more, "
                                      f"not {count!r}")
    if not isinstance(m.get("kernel", "*"), str):
        raise _fail(path, m, "kernel",
                    f"metrics[{i}].kernel: must be a glob on kernel names, e.g. '*gemm*'")
    return Metric(m["kind"], m.get("name"), count, m.get("kernel", "*"))


def load(path: str | Path) -> Playbook:
    path = Path(path)
    doc = read_yaml(path)
    _check_keys(path, doc)
    name = _name(path, doc)
    command = _command(path, doc)
    target = _target(path, doc)
    tool, args = _profiler(path, doc)
    metrics = _metrics(path, doc)
    thresholds = _thresholds(path, doc)
    return Playbook(name, str(path), command, dict(target), tool, args, metrics, thresholds,
                    _ranks(path, doc), *_workload(path, doc))


def _check_keys(path: Path, doc: Any) -> None:
    """The file is a mapping, and of known keys only."""
    if not hasattr(doc, "line_of"):
        raise PlaybookError(f"{path}:1",
                            "a playbook is a mapping (name, target, command, metrics, ...)")
    for key in doc:
        if key not in PLAYBOOK_KEYS:
            raise _fail(path, doc, key, _unknown("key", key, PLAYBOOK_KEYS))


def _name(path: Path, doc: Any) -> str:
    """``name: resnet-nightly``, or the file's stem: it names the playbook's
    schedule and history."""
    name = doc.get("name", path.stem)
    if not safenames.is_safe(name):
        raise _fail(path, doc, "name" if "name" in doc else None,
                    f"name: {name!r} must be {safenames.RULE} (it names the "
                    "playbook's schedule and its history)")
    return name


def _command(path: Path, doc: Any) -> tuple[str, ...]:
    """``command: [python3, bench.py, --steps, '100']``: the workload to profile, as words."""
    command = doc.get("command")
    if isinstance(command,
                  str) or not command or not all(isinstance(w, (str, int, float)) for w in command):
        raise _fail(path, doc, "command" if "command" in doc else None,
                    "command must be a list of words, e.g. [python3, bench.py, --steps, '100']")
    return tuple(str(w) for w in command)


def _target(path: Path, doc: Any) -> Any:
    """``target: {partition: gpu, nodes: 2}`` (Slurm) or ``{hosts: lab}``:
    where the playbook runs."""
    target = doc.get("target")
    if not hasattr(target, "line_of") or not ({"partition", "cluster", "hosts"} & set(target)):
        raise _fail(path, doc, "target" if "target" in doc else None,
                    "target must be a mapping with partition (Slurm) or hosts (lab servers)")
    for key, value in target.items():
        _target_field(path, target, key, value)
    if target.get("launcher", "srun") not in LAUNCHERS:
        raise _fail(path, target, "launcher", f"target.launcher: one of {', '.join(LAUNCHERS)}, "
                                              f"not {target['launcher']!r}")
    return target


def _target_field(path: Path, target: Any, key: Any, value: Any) -> None:
    """One of the target's keys: known, of its type, and safe to hand to sbatch."""
    if key not in TARGET_KEYS:
        raise _fail(path, target, key, "target: " + _unknown("key", key, TARGET_KEYS))
    if not isinstance(value, TARGET_KEYS[key]) or isinstance(value, bool):
        raise _fail(path, target, key,
                    f"target.{key}: must be a {TARGET_KEYS[key].__name__}, not {value!r}")
    try:  # what sbatch would not take, or would read as more #SBATCH lines or shell
        slurm_options.check_field(key, value)
        if key == "ranks":
            slurm_options.parse_ranks(",".join(map(str, value)))
    except UnsafeValue as e:
        raise _fail(path, target, key, f"target.{key}: {e}") from None


def _profiler(path: Path, doc: Any) -> tuple[str, tuple[str, ...]]:
    """``tool: nsys`` (or ncu) and its ``profiler_args``, checked as ``fleet
    profile -X`` checks them."""
    tool = doc.get("tool", "nsys")
    if tool not in ("nsys", "ncu"):
        raise _fail(path, doc, "tool", "tool must be nsys or ncu")
    args = doc.get("profiler_args") or []
    if isinstance(args, str) or not isinstance(args,
                                               list) or not all(isinstance(a, (str, int, float))
                                                                for a in args):
        raise _fail(path, doc, "profiler_args",
                    "profiler_args must be a list of words, e.g. [--trace=cuda,nvtx]")
    # as `fleet profile -X` would say
    if (why := profiler_args_error(tool, tuple(str(a) for a in args))):
        raise _fail(path, doc, "profiler_args", why)
    return tool, tuple(str(a) for a in args)


def _metrics(path: Path, doc: Any) -> tuple[Metric, ...]:
    """``metrics: [{kind: gpu_kernel_total}, ...]``: what to track; the total
    GPU kernel time if none."""
    given = doc.get("metrics") or [{"kind": "gpu_kernel_total"}]
    if not isinstance(given, list):
        raise _fail(path, doc, "metrics", "metrics must be a list, e.g. [{kind: gpu_kernel_total}]")
    return tuple(_metric(path, i, m, doc.get("metrics")) for i, m in enumerate(given))


def _thresholds(path: Path, doc: Any) -> dict[str, float]:
    """``thresholds: {regression: 0.1}``: the defaults, with those given in their place."""
    thresholds = dict(DEFAULT_THRESHOLDS)
    given = doc.get("thresholds")
    if given is not None and not hasattr(given, "line_of"):
        raise _fail(path, doc, "thresholds", "thresholds must be a mapping, e.g. {regression: 0.1}")
    given = given or {}
    for key, value in given.items():
        if key not in DEFAULT_THRESHOLDS:
            raise _fail(path, given, key, "thresholds: " + _unknown("key", key, DEFAULT_THRESHOLDS))
        if not isinstance(value,
                          (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
            raise _fail(path, given, key,
                        f"thresholds.{key}: must be a number, 0 or more, not {value!r}")
        thresholds[key] = value
    return thresholds


def _workload(path: Path, doc: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The workload's version and checkout commands; a checkout is checked by asking the version."""
    version, checkout = _words(path, doc, "version"), _words(path, doc, "checkout")
    if checkout and not version:
        raise _fail(path, doc, "checkout",
                    "checkout needs version too: fleet checks each checkout by asking it")
    return version, checkout


WORDS_EXAMPLE = {"version": "[git, -C, ~/proj, rev-parse, HEAD]",
                 "checkout": "[git, -C, ~/proj, checkout, --quiet]"}


def _words(path: Path, doc: Any, key: str) -> tuple[str, ...]:
    """``version: [git, -C, ~/proj, rev-parse, HEAD]``: how to ask the workload's version, as words;
    ``checkout: [git, -C, ~/proj, checkout, --quiet]``: how to put it at a version
    (given as one more word)."""
    words = doc.get(key)
    if words is None:
        return ()
    if isinstance(words, str) or not isinstance(words, list) or not words or \
            not all(isinstance(w, (str, int, float)) and not isinstance(w, bool) for w in words):
        raise _fail(path, doc, key, f"{key} must be a list of words, e.g. {WORDS_EXAMPLE[key]}")
    for word in words:
        try:
            safenames.check_text(str(word), key)
        except UnsafeValue as e:
            raise _fail(path, doc, key, str(e)) from None
    return tuple(str(w) for w in words)


def _ranks(path: Path, doc: Any) -> dict[str, str]:
    """``ranks: {sync_range: NAME}``: where the straggler share finds the workload's syncs."""
    given = doc.get("ranks")
    if given is None:
        return {}
    if not hasattr(given, "line_of"):
        raise _fail(path, doc, "ranks", "ranks must be a mapping, e.g. {sync_range: allreduce}")
    for key, value in given.items():
        if key not in RANKS_KEYS:
            raise _fail(path, given, key, "ranks: " + _unknown("key", key, RANKS_KEYS))
        if not isinstance(value, str) or not value:
            raise _fail(path, given, key,
                        f"ranks.{key}: must be a name (an NVTX range, a function, or for record a "
                                          f"file), not {value!r}")
    if "sync_range" in given and "sync_call" in given:
        raise _fail(path, given, "sync_call",
                    "ranks: sync_range and sync_call name the sync two ways: give one")
    return dict(given)


# --- metrics from a run's summaries ---

def _summed(metric: Metric, rows: list[SummaryRow]) -> dict[str, float]:
    """The rows' total time under the metric's label; nothing when no row is there."""
    return {metric.label: sum(r.total_ns for r in rows)} if rows else {}


def _kernel_total(metric: Metric, kern: list[SummaryRow],
                  summaries: dict[str, Path]) -> dict[str, float]:
    """``gpu_kernel_total``: every kernel's time."""
    return _summed(metric, kern)


def _kernel(metric: Metric, kern: list[SummaryRow], summaries: dict[str, Path]) -> dict[str, float]:
    """``kernel``: the time of the kernels whose names match the glob."""
    hits = [r for r in kern if fnmatch.fnmatchcase(r.name or "", metric.name or "")]
    return _summed(metric, hits)


def _top_kernels(metric: Metric, kern: list[SummaryRow],
                 summaries: dict[str, Path]) -> dict[str, float]:
    """``top_kernels``: the longest kernels, each its own value."""
    top = sorted(kern, key=lambda r: r.total_ns, reverse=True)[:metric.count]
    return {f"kernel {r.name}": r.total_ns for r in top}


def _ncu(metric: Metric, kern: list[SummaryRow], summaries: dict[str, Path]) -> dict[str, float]:
    """``ncu``: from the run's raw ncu page, when it has one."""
    return ncu_value(metric, summaries["ncu_raw"]) if "ncu_raw" in summaries else {}


def _nvtx(metric: Metric, kern: list[SummaryRow], summaries: dict[str, Path]) -> dict[str, float]:
    """``nvtx``: the time of the ranges whose names match the glob."""
    nvtx = summary_rows(summaries["nvtx_sum"]) if "nvtx_sum" in summaries else []
    hits = [r for r in nvtx if fnmatch.fnmatchcase(r.range_name, metric.name or "")]
    return _summed(metric, hits)


_METRIC_READERS = {"gpu_kernel_total": _kernel_total, "kernel": _kernel,
                   "top_kernels": _top_kernels, "ncu": _ncu}


def metric_values(metric: Metric, summaries: dict[str, Path]) -> dict[str, float]:
    """name -> value (ns) for one metric of one rank, from its stored ``nsys stats`` CSV files."""
    # read for every kind
    kern = (summary_rows(summaries["cuda_gpu_kern_sum"]) if "cuda_gpu_kern_sum" in summaries
            else [])
    return _METRIC_READERS.get(metric.kind, _nvtx)(metric, kern, summaries)


def ncu_value(metric: Metric, csv_path: Path) -> dict[str, float]:
    """One ncu metric summed over the matching kernels of ``ncu --import --page raw --csv``
    (a header row, a units row, a row per kernel; numbers may carry thousands separators)."""
    page = NcuPage.read(csv_rows(csv_path), metric.name)
    if page is None:
        return {}
    hits = [r for r in page.launches if fnmatch.fnmatchcase(r.kernel or "", metric.kernel)]
    values = [float(r.value.replace(",", "")) for r in hits if (r.value or "").strip()]
    label = f"{metric.label} ({page.unit})" if page.unit else metric.label
    return {label: sum(values)} if values else {}


def run_metrics(playbook: Playbook, manifest: "RunManifest") -> list[dict]:
    """One row per metric, device and rank of a finished run, with the noise context."""
    out = []
    for h in manifest.hosts:
        summaries = {rep.summary: Path(rep.stored) for rep in h.reports
                     if rep.status == "summary" and rep.verified and rep.summary}
        flagged = [*environment.tenants_of(h, manifest.user or None), *h.given_up]
        device = f"{h.gpu or 'no GPU'} on {h.host}" + (f" rank {h.rank}" if h.rank is not None
                                                       else "")
        for metric in playbook.metrics:
            for name, value in metric_values(metric, summaries).items():
                out.append({"metric": name, "device": device, "value": value, "flags": flagged,
                            "gpu": h.gpu, "driver": h.driver, "tool_version": h.tool_version})
    return out
