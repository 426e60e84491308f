"""The verdict on each straggler: its causes, each with the evidence it rests on.

Checked in this order, because a later check is only meaningful once an earlier one is known: a
shared GPU first (another rank of the job or a tenant on it, which makes every kernel on it look
slower: per-kernel times are then not compared), then more work (kernel count and time in the
window before each collective), a CPU gap (the GPU idle in that window), slower kernels for the
same work, and clocks or throttling from what fleet sampled on the node.
"""

from __future__ import annotations

import statistics

from .inputs import MORE, VERDICT_SHARE, RankInput, Source, windows
from .inputs import gpu_of as gpus_of

EVEN = 0.5      # a straggler that waited at least half as long as the others is no clear straggler


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms"


def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0


def verdicts(present: list[RankInput], matched: dict, stats: dict, gpus: dict, source: Source,
             n: int, missing: list[dict], per: list[dict]) -> list[dict]:
    """One verdict per rank that was last in a fair share of the collectives,
    most often last first."""
    order = sorted(stats.values(), key=lambda s: (-s.last, s.label))
    chosen = [s for s in order if s.last and (s is order[0] or s.last / n >= VERDICT_SHARE)]
    by_label = {r.label: r for r in present}
    return [verdict(by_label[s.label], present, matched, gpus, source, n, missing, per, s.last)
            for s in chosen]


def verdict(s: RankInput, present: list[RankInput], matched: dict, gpus: dict, source: Source,
            n: int, missing: list[dict], per: list[dict], last: int) -> dict:
    caused = [i for i, c in enumerate(per) if c["straggler"] == s.label]
    others = [r for r in present if r is not s]
    mine, flat = _caused_windows(s, others, matched, source, caused)
    wait, other_wait = _waits(s, per, caused)
    doc = {"rank": s.label, "last": last, "of": n, "wait_ms": wait / 1e6,
           "others_wait_ms": other_wait / 1e6,
           "lost_s": sum(v - per[i]["waits_s"][s.label] for i in caused
                         for v in per[i]["waits_s"].values()),
           "gpu": gpus[s.label], "causes": []}
    if other_wait and wait >= EVEN * other_wait:
        doc["causes"].append(_even(s, wait, other_wait, missing))
        return _summed(doc)
    doc["causes"] += _causes(s, others, gpus, mine, flat)
    return _summed(doc)


def _caused_windows(s: RankInput, others: list[RankInput], matched: dict, source: Source,
                    caused: list[int]) -> tuple[list, list]:
    """The windows before each collective the straggler was last at: its own, and the other
    ranks' all together."""
    mine = [w for i, w in enumerate(windows(s.process, matched[s.label], source)) if i in caused]
    theirs = [[w for i, w in enumerate(windows(r.process, matched[r.label], source)) if i in caused]
              for r in others]
    return mine, [w for ws in theirs for w in ws]


def _waits(s: RankInput, per: list[dict], caused: list[int]) -> tuple[float, float]:
    """The straggler's median wait (ns) in the collectives it was last at, and the other ranks'."""
    wait = _median(per[i]["waits_s"][s.label] for i in caused) * 1e9
    other_wait = _median(v * 1e9 for i in caused for lb, v in per[i]["waits_s"].items()
                         if lb != s.label)
    return wait, other_wait


def _causes(s: RankInput, others: list[RankInput], gpus: dict, mine: list,
            flat: list) -> list[dict]:
    """The causes of a clear straggler, in the order of the module's checks;
    "none found" without one."""
    shared = _shared(s, others, gpus)
    causes = shared + _work(mine, flat, bool(shared)) + _cpu_gap(mine, flat) + _clocks(s, others)
    return causes or [_none_found(mine)]


def _kernels(ws: list) -> tuple[float, float]:
    """The median kernel count and kernel time (ns) of the windows."""
    return _median(w.kernels for w in ws), _median(w.kernel_ns for w in ws)


def _work(mine: list, flat: list, shared: bool) -> list[dict]:
    """More kernels than the other ranks before each collective, or else (on a GPU not shared, where
    per-kernel times compare) the same work taking longer."""
    (count, k_ns), (o_count, o_k_ns) = _kernels(mine), _kernels(flat)
    if count >= MORE * o_count and count - o_count >= 1:
        return [{"cause": "more work", "evidence":
                 f"{count:.0f} kernels ({_ms(k_ns)}) in the window before each collective it was "
                 f"last at, against {o_count:.0f} ({_ms(o_k_ns)}) on the other ranks"}]
    if not shared and k_ns >= MORE * o_k_ns:
        return [{"cause": "slower kernels", "evidence":
                 f"about the same work ({count:.0f} kernels against {o_count:.0f}) took "
                 f"{_ms(k_ns)} against {_ms(o_k_ns)} on the other ranks"}]
    return []


def _cpu_gap(mine: list, flat: list) -> list[dict]:
    """The straggler's GPU idle most of each window, well beyond the other ranks': the CPU side."""
    idle = _median(w.length - w.busy_ns for w in mine)
    o_idle, o_len = _median(w.length - w.busy_ns for w in flat), _median(w.length for w in flat)
    length = _median(w.length for w in mine)
    if length and idle >= 0.5 * length and idle - o_idle >= 0.2 * max(o_len, 1):
        return [{"cause": "CPU gap", "evidence":
                 f"its GPU was idle {_ms(idle)} of the {_ms(length)} before each collective it was "
                 f"last at (the other ranks: {_ms(o_idle)} of {_ms(o_len)}): "
                 "the time went on the CPU side"}]
    return []


def _none_found(mine: list) -> dict:
    """No cause the checks know: the straggler's work was as the others', so look
    before each collective."""
    count, k_ns = _kernels(mine)
    return {"cause": "none found", "evidence":
            f"the same work ({count:.0f} kernels, {_ms(k_ns)}), no idle GPU, no shared GPU, no "
            f"throttling recorded: look at what happened before it entered each collective"}


def _summed(doc: dict) -> dict:
    doc["summary"] = (f"{doc['rank']} was last in {doc['last']} of {doc['of']} collectives: "
                      + "; ".join(c["cause"] for c in doc["causes"]))
    return doc


def _even(s: RankInput, wait: float, other_wait: float, missing: list[dict]) -> dict:
    """No present rank stands out: every one waited about as long. With a rank missing, that
    rank is the likeliest to have held the others back."""
    if missing:
        names = ", ".join(m["label"] for m in missing)
        return {"cause": "missing rank", "evidence":
                f"every rank here waited at least {_ms(wait)} in each collective ({s.label} the "
                f"least, the others {_ms(other_wait)}), so the rank they waited for is likely one "
                f"that left no export: {names}"}
    return {"cause": "no clear straggler", "evidence":
            f"{s.label} waited {_ms(wait)}, the others {_ms(other_wait)}: "
            "the ranks arrive about together"}


def _gpu_words(g: dict) -> str:
    if g.get("index") is not None:
        return f"GPU {g['index']}"
    return f"the GPU at {g['bus']}" if g.get("bus") else f"GPU {g.get('uuid') or '?'}"


def _shared(s: RankInput, others: list[RankInput], gpus: dict) -> list[dict]:
    """Other ranks of the job on the straggler's GPU (the same UUID in their exports), and the
    tenants fleet recorded on it."""
    mine = gpus[s.label]
    with_me = [r.label for r in others
               if mine.get("uuid") and gpus[r.label].get("uuid") == mine["uuid"]]
    found = []
    if with_me:
        found.append({"cause": "shared GPU", "evidence":
                      f"shared {_gpu_words(mine)} ({mine.get('name') or 'GPU'}, "
                      f"{mine.get('uuid')}) with {', '.join(with_me)} of this job: per-kernel "
                      f"times are not compared, since every kernel on a shared GPU runs slower"})
    if s.node.tenants:
        found.append({"cause": "shared GPU", "evidence":
                      f"shared {_gpu_words(mine)} with another user's process: "
                      f"{'; '.join(s.node.tenants)}"})
    return found


def _sm_clock(r: RankInput) -> float | None:
    clocks = [x.conditions.sm_clock_mhz for x in r.node.samples
              if x.conditions.sm_clock_mhz is not None]
    return _median(clocks) if clocks else None


def _throttled(r: RankInput) -> tuple[list[str], int]:
    """The throttle reasons sampled on the rank's GPU (an idle GPU's reason is no slowdown)."""
    reasons, hit = {}, 0
    for x in r.node.samples:
        found = [t for t in x.conditions.throttle or () if "idle" not in t.lower()]
        hit += bool(found)
        for t in found:
            reasons[str(t)] = None
    return list(reasons), hit


def _clocks(s: RankInput, others: list[RankInput]) -> list[dict]:
    reasons, hit = _throttled(s)
    clock = _sm_clock(s)
    o_clock = _median(c for c in (_sm_clock(r) for r in others) if c is not None) or None
    slow_clock = clock is not None and o_clock and clock < 0.9 * o_clock
    if not reasons and not slow_clock:
        return []
    words = []
    if reasons:
        words.append(f"throttled ({', '.join(reasons)}) in {hit} of {len(s.node.samples)} samples")
    if clock is not None:
        words.append(f"SM clock {clock:.0f} MHz" + (f" against {o_clock:.0f} MHz on the other "
                                                    "ranks' GPUs"
                                                      if o_clock else ""))
    gpu = _gpu_words(gpus_of(s)) if s.process.gpus or s.node.gpu_index is not None else "its GPU"
    return [{"cause": "clocks or throttling", "evidence": f"{gpu}: " + ", ".join(words)}]
