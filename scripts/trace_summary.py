"""Where the time of a profiled step goes: top device kernels, and what the host did while the device sat idle.

    python scripts/trace_summary.py TRACE [TRACE ...] [--top 15] [--out REPORT.md]

TRACE is a torch.profiler Chrome trace (`prof.export_chrome_trace(path)`, `.json` or `.json.gz`; SGLang
writes `*.trace.json.gz`). One markdown report per file:

- window: the span of the `areal/*` user annotations (e.g. `areal/step`), or of all events without them;
- phases: total time of each `areal/phase/*` annotation;
- device: busy time (union over all streams, so overlapping kernels count once) and the top kernels,
  memcpys and memsets by total device time;
- gaps: each idle device microsecond is put down to what the host was doing then, by priority:
  synchronisation > allocation > host-device copies > kernel launch > Python / CPU ops > nothing;
  and the host ops that ran then, by their own time inside the idle intervals, per thread (which
  op, FSDP hook or, with `with_stack`, Python function holds the device back);
- a trace without device events (a CPU-only run) lists the top host ops by self (exclusive) time instead.

Timestamps and durations in Chrome traces are microseconds; the report prints milliseconds.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import functools
import gc
import gzip
import json
import sys
from pathlib import Path
from typing import Callable, NamedTuple

AREAL_PREFIX = "areal/"
PHASE_PREFIX = "areal/phase/"
# Kineto's categories for device work; older kineto wrote "Kernel"/"Memcpy"/"Memset", so compare lower-cased.
DEVICE_CATS = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "privateuse1_runtime", "privateuse1_driver"}
# X events that say nothing about what a host thread is doing: the profiler's own span, device-side copies
# of user annotations, and step annotations that wrap everything (`areal/*` is handled separately).
NOT_HOST_WORK_CATS = {"trace", "gpu_user_annotation", "overhead"}
PROFILER_STEP_PREFIX = "ProfilerStep#"
ALLOC_PREFIXES = (
    "cudaMalloc",  # also cudaMallocHost, cudaMallocAsync
    "cudaFree",  # also cudaFreeHost, cudaFreeAsync
    "cudaHostAlloc",
    "cudaHostRegister",
    "cudaHostUnregister",
    "cuMemAlloc",
    "cuMemFree",
    "cuMemHostAlloc",
    "cuMemCreate",  # expandable segments map and unmap physical memory
    "cuMemMap",
    "cuMemUnmap",
    "cuMemRelease",
    "cuMemSetAccess",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "hipMalloc",
    "hipFree",
    "hipHostMalloc",
    "hipHostFree",
)
# Gap classes in priority order: an idle moment goes to the first class the host is doing anything of.
SYNC, ALLOC, COPY, LAUNCH, PYTHON, HOST_IDLE = range(6)
NOT_HOST = -1
GAP_CLASSES = (
    "synchronisation",
    "allocation",
    "host-device copies",
    "kernel launch",
    "Python / CPU ops",
    "host idle (other threads / waiting)",
)
IDLE_SLOT = HOST_IDLE  # in the gap sweep, slots 0..4 count open host events per class; this one idle intervals
NO_PHASE = "(outside areal/phase/*)"
NAME_WIDTH = 90


class Event(NamedTuple):
    cat: str
    name: str
    start: float  # microseconds
    end: float
    thread: tuple  # (pid, tid)
    device: str  # "kernel", "memcpy" or "memset" for device work, else ""
    host: int  # gap class (SYNC..PYTHON) of host work, else NOT_HOST
    areal: bool  # an `areal/*` user annotation: marks the window and phases, is not host work


# ---------------------------------------------------------------- reading


def load_events(path: str) -> list[dict]:
    """The trace's event list; SystemExit naming the file when it is not a Chrome trace."""
    expected = "a Chrome trace: a JSON list of events or an object with 'traceEvents' (torch.profiler's export)"
    try:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise SystemExit(f"{path}: no such file; pass the path of a trace written by export_chrome_trace") from None
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SystemExit(f"{path}: cannot be read as JSON ({err}); expected {expected}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise SystemExit(
            f"{path}: top level is {type(data).__name__} without a 'traceEvents' list; expected {expected}"
        )
    return events


def complete_events(events: list[dict]) -> list[Event]:
    """The complete ("ph": "X") events, with numeric times; other phases (metadata, flows, instants) are skipped."""
    out = []
    for i, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        try:
            start, dur = float(ev["ts"]), float(ev.get("dur") or 0.0)
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"event {i} ({ev.get('name')!r}) has ts={ev.get('ts')!r} dur={ev.get('dur')!r}; "
                "complete events need numeric 'ts' and 'dur' in microseconds"
            ) from None
        cat, name = str(ev.get("cat") or ""), str(ev.get("name") or "")
        out.append(Event(cat, name, start, start + max(dur, 0.0), (ev.get("pid"), ev.get("tid")), *roles(cat, name)))
    return out


# ---------------------------------------------------------------- classifying events


@functools.cache  # a trace has ~10^6 events but a few thousand distinct (cat, name) pairs
def roles(cat: str, name: str) -> tuple[str, int, bool]:
    """(device kind, host gap class, is an areal/ annotation) of one event, as the Event fields."""
    device = DEVICE_CATS.get(cat.lower(), "")
    areal = cat == "user_annotation" and name.startswith(AREAL_PREFIX)
    wraps_step = cat == "user_annotation" and name.startswith(PROFILER_STEP_PREFIX)
    if device or areal or wraps_step or cat.lower() in NOT_HOST_WORK_CATS:
        return device, NOT_HOST, areal
    return device, runtime_call_class(name) if cat.lower() in RUNTIME_CATS else PYTHON, areal


def runtime_call_class(name: str) -> int:
    """The gap class of one CUDA (or HIP) runtime/driver call."""
    if "Synchronize" in name or ("Memcpy" in name and "Async" not in name):
        return SYNC  # a blocking cudaMemcpy waits for the device just like a synchronize
    if name.startswith(ALLOC_PREFIXES):
        return ALLOC
    if "Memcpy" in name or "Memset" in name:
        return COPY
    if "Launch" in name:
        return LAUNCH
    return PYTHON  # other runtime calls (cudaEventRecord, cudaGetDevice, ...) are host CPU time like any op


# ---------------------------------------------------------------- intervals


def find_window(events: list[Event]) -> tuple[float, float, str]:
    """(start, end, what it spans): the `areal/*` annotations when there are any, else every event."""
    marked = [ev for ev in events if ev.areal]
    spanned = marked or events
    source = "span of the areal/* annotations" if marked else "first to last event"
    return min(ev.start for ev in spanned), max(ev.end for ev in spanned), source


def pct(part: float, whole: float) -> float:
    return 100 * part / whole if whole > 0 else 0.0  # a zero-length window (one instant) has no shares


def clip(ev: Event, lo: float, hi: float) -> tuple[float, float] | None:
    start, end = max(ev.start, lo), min(ev.end, hi)
    return (start, end) if end > start else None


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merged, sorted, non-overlapping cover of the intervals."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def complement(busy: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The parts of [lo, hi] that no interval of `busy` (merged, sorted, inside [lo, hi]) covers."""
    idle, cursor = [], lo
    for start, end in busy:
        if start > cursor:
            idle.append((cursor, start))
        cursor = max(cursor, end)
    if hi > cursor:
        idle.append((cursor, hi))
    return idle


# ---------------------------------------------------------------- phases and device


def phase_totals(events: list[Event]) -> list[dict]:
    """Total and count per `areal/phase/*` annotation name, in order of first appearance."""
    totals: dict[str, list[float]] = {}
    for ev in sorted((ev for ev in events if ev.areal and ev.name.startswith(PHASE_PREFIX)), key=lambda ev: ev.start):
        total = totals.setdefault(ev.name, [0, 0.0])
        total[0] += 1
        total[1] += ev.end - ev.start
    return [{"name": name, "count": int(n), "ms": us / 1e3} for name, (n, us) in totals.items()]


def device_ops(events: list[Event], lo: float, hi: float, busy_us: float) -> list[dict]:
    """Every kernel/memcpy/memset name with its count and device time inside the window, longest first."""
    stats: dict[tuple[str, str], list[float]] = {}
    for ev in events:
        if ev.device and (span := clip(ev, lo, hi)):
            entry = stats.setdefault((ev.name, ev.device), [0, 0.0])
            entry[0] += 1
            entry[1] += span[1] - span[0]
    rows = [
        {"name": name, "kind": kind, "count": int(n), "ms": us / 1e3, "pct_of_busy": pct(us, busy_us)}
        for (name, kind), (n, us) in stats.items()
    ]
    return sorted(rows, key=lambda row: (-row["ms"], row["name"]))


# ---------------------------------------------------------------- gaps


def gap_boundaries(events: list[Event], idle: list[tuple[float, float]], lo: float, hi: float):
    """Sorted (time, +1/-1, slot) boundaries for the sweep; slots 0..4 are host classes, IDLE_SLOT the idle
    device, and IDLE_SLOT + 1 + k the k-th phase annotation."""
    marks = []
    for start, end in idle:
        marks += [(start, 1, IDLE_SLOT), (end, -1, IDLE_SLOT)]
    phases = [ev for ev in events if ev.areal and ev.name.startswith(PHASE_PREFIX)]
    for k, ev in enumerate(phases):
        if span := clip(ev, lo, hi):
            marks += [(span[0], 1, IDLE_SLOT + 1 + k), (span[1], -1, IDLE_SLOT + 1 + k)]
    for ev in events:
        if ev.host != NOT_HOST and (span := clip(ev, lo, hi)):
            marks += [(span[0], 1, ev.host), (span[1], -1, ev.host)]
    marks.sort()
    return marks, [ev.name for ev in phases]


def innermost_phase(active: dict[int, float], names: list[str]) -> str:
    """The active phase that started last (the innermost when phases nest), or NO_PHASE."""
    if not active:
        return NO_PHASE
    return names[max(active, key=lambda k: (active[k], k))]


def attribute_gaps(events: list[Event], idle: list[tuple[float, float]], lo: float, hi: float):
    """Idle device microseconds by host class and by phase, in one sweep over sorted boundaries."""
    marks, names = gap_boundaries(events, idle, lo, hi)
    depth = [0] * (IDLE_SLOT + 1)  # open host events per class, and open idle intervals
    active: dict[int, float] = {}  # open phase annotations: k -> start
    by_class, by_phase = [0.0] * len(GAP_CLASSES), collections.defaultdict(float)
    previous, phase = lo, NO_PHASE
    for time, delta, slot in marks:
        if time > previous and depth[IDLE_SLOT] > 0:
            cls = next((c for c in range(HOST_IDLE) if depth[c] > 0), HOST_IDLE)
            by_class[cls] += time - previous
            by_phase[phase] += time - previous
        previous = time
        if slot <= IDLE_SLOT:
            depth[slot] += delta
            continue
        if delta > 0:
            active[slot - IDLE_SLOT - 1] = time
        else:
            active.pop(slot - IDLE_SLOT - 1, None)
        phase = innermost_phase(active, names)
    return dict(zip(GAP_CLASSES, by_class)), dict(by_phase)


# ---------------------------------------------------------------- host self time


def length(start: float, end: float) -> float:
    return end - start


def self_times_on_thread(
    spans: list[tuple[float, float, Event]], measure: Callable[[float, float], float] = length
) -> list[tuple[Event, float]]:
    """(event, exclusive us) for one thread's events: the measure of its span (its duration, or the
    device-idle time within it) minus that of its direct children's spans.
    Events nest per thread; sorting by start, longer first, puts each parent before its children."""
    spans = sorted(spans, key=lambda s: (s[0], -s[1]))
    stack: list[list] = []  # [end, event, self time]
    out = []
    for start, end, ev in spans:
        while stack and stack[-1][0] <= start:
            out.append((stack[-1][1], stack.pop()[2]))
        if stack:
            stack[-1][2] -= measure(start, min(end, stack[-1][0]))  # a child's time is not its parent's own
        stack.append([end, ev, measure(start, end)])
    out += [(ev, own) for _, ev, own in stack]
    return out


def host_spans_by_thread(events: list[Event], lo: float, hi: float) -> dict[tuple, list]:
    threads: dict[tuple, list] = collections.defaultdict(list)
    for ev in events:
        span = clip(ev, lo, hi) if ev.host != NOT_HOST else None
        if span:
            threads[ev.thread].append((span[0], span[1], ev))
    return threads


def host_ops(events: list[Event], lo: float, hi: float) -> list[dict]:
    """Every `cpu_op` name with its count and total self time inside the window, longest first."""
    stats: dict[str, list[float]] = {}
    for spans in host_spans_by_thread(events, lo, hi).values():
        for ev, own in self_times_on_thread(spans):
            if ev.cat == "cpu_op":
                entry = stats.setdefault(ev.name, [0, 0.0])
                entry[0] += 1
                entry[1] += max(own, 0.0)
    rows = [
        {"name": name, "count": int(n), "self_ms": us / 1e3, "pct_of_window": pct(us, hi - lo)}
        for name, (n, us) in stats.items()
    ]
    return sorted(rows, key=lambda row: (-row["self_ms"], row["name"]))


def idle_time_within(idle: list[tuple[float, float]]) -> Callable[[float, float], float]:
    """measure(start, end): how much of [start, end] the device sat idle (idle: merged, sorted)."""
    starts = [start for start, _ in idle]
    before = [0.0]  # idle time before the k-th interval
    for start, end in idle:
        before.append(before[-1] + end - start)

    def idle_until(t: float) -> float:
        k = bisect.bisect_right(starts, t)
        return before[k - 1] + min(t, idle[k - 1][1]) - idle[k - 1][0] if k else 0.0

    return lambda start, end: idle_until(end) - idle_until(start)


def host_ops_while_idle(events: list[Event], idle: list[tuple[float, float]], lo: float, hi: float) -> list[dict]:
    """What each host thread ran while the device sat idle: per (thread, op), the op's own time
    (its children's left out) that falls in idle intervals, longest first. Ops are cpu_op, user
    annotations such as FSDP's, Python functions (with_stack) and runtime calls; the thread is
    named by the rank of its idle time (1: the most), since tids mean nothing across runs."""
    measure = idle_time_within(idle)
    stats: dict[tuple, list[float]] = {}
    for thread, spans in host_spans_by_thread(events, lo, hi).items():
        for ev, own in self_times_on_thread(spans, measure):
            if own > 0:
                entry = stats.setdefault((thread, ev.cat, ev.name), [0, 0.0])
                entry[0] += 1
                entry[1] += own
    by_thread: dict[tuple, float] = collections.defaultdict(float)
    for (thread, _, _), (_, us) in stats.items():
        by_thread[thread] += us
    rank = {thread: k + 1 for k, thread in enumerate(sorted(by_thread, key=lambda t: (-by_thread[t], str(t))))}
    rows = [
        {"thread": rank[thread], "cat": cat, "name": name, "count": int(n), "idle_ms": us / 1e3}
        for (thread, cat, name), (n, us) in stats.items()
    ]
    return sorted(rows, key=lambda row: (-row["idle_ms"], row["thread"], row["name"]))


# ---------------------------------------------------------------- summary


@contextlib.contextmanager
def gc_paused():
    """The events hold no cycles, and with ~10^7 live objects the collector's passes cost more than the work."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def summarize_events(events: list[dict], top: int = 15) -> dict:
    """The report's numbers (milliseconds, percentages) for one trace's event list."""
    with gc_paused():
        evs = complete_events(events)
        if not evs:
            raise ValueError("no complete ('ph': 'X') events; expected a trace of a profiled run")
        return summary_of(evs, top)


def summary_of(evs: list[Event], top: int) -> dict:
    """summarize_events' numbers from the parsed events: the device sections, or host ops when there is no device."""
    lo, hi, source = find_window(evs)
    busy = union([span for ev in evs if ev.device and (span := clip(ev, lo, hi))])
    busy_us = sum(end - start for start, end in busy)
    out = {
        "window_ms": (hi - lo) / 1e3,
        "window_source": source,
        "phases": phase_totals(evs),
        "has_device": any(ev.device for ev in evs),
        "device_busy_ms": busy_us / 1e3,
        "device_busy_pct": pct(busy_us, hi - lo),
        "kernels": [],
        "device_ms_by_kind": {},
        "gaps_ms": 0.0,
        "gaps_by_class": {},
        "gaps_by_phase": {},
        "host_ops": [],
        "idle_host_ops": [],
    }
    if out["has_device"]:
        out.update(device_section(evs, lo, hi, busy, busy_us, top))
    else:
        out["host_ops"] = host_ops(evs, lo, hi)[:top]
    return out


def device_section(evs: list[Event], lo: float, hi: float, busy: list, busy_us: float, top: int) -> dict:
    ops = device_ops(evs, lo, hi, busy_us)
    by_kind: dict[str, float] = collections.defaultdict(float)
    for row in ops:
        by_kind[row["kind"]] += row["ms"]
    idle = complement(busy, lo, hi)
    by_class, by_phase = attribute_gaps(evs, idle, lo, hi)
    return {
        "kernels": ops[:top],
        "device_ms_by_kind": dict(by_kind),
        "gaps_ms": sum(end - start for start, end in idle) / 1e3,
        "gaps_by_class": {name: us / 1e3 for name, us in by_class.items()},
        "gaps_by_phase": {name: us / 1e3 for name, us in by_phase.items()},
        "idle_host_ops": host_ops_while_idle(evs, idle, lo, hi)[:top],
    }


# ---------------------------------------------------------------- markdown


def cell(name: str) -> str:
    """A name fit for a markdown table cell: at most NAME_WIDTH characters, pipes escaped."""
    short = name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 3] + "..."
    return short.replace("|", "\\|")


def table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]


def phase_lines(s: dict) -> list[str]:
    if not s["phases"]:
        return ["No `areal/phase/*` annotations."]
    rows = [[cell(p["name"]), p["count"], f"{p['ms']:.3f}", f"{pct(p['ms'], s['window_ms']):.1f}"] for p in s["phases"]]
    return table(["phase", "count", "total ms", "% of window"], rows)


def device_lines(s: dict) -> list[str]:
    kinds = ", ".join(f"{kind} {ms:.3f} ms" for kind, ms in s["device_ms_by_kind"].items())
    lines = [f"Device busy: {s['device_busy_ms']:.3f} ms ({s['device_busy_pct']:.1f}% of window; {kinds}).", ""]
    rows = [[cell(k["name"]), k["kind"], k["count"], f"{k['ms']:.3f}", f"{k['pct_of_busy']:.1f}"] for k in s["kernels"]]
    return lines + table(["kernel / copy", "kind", "count", "total ms", "% of busy"], rows)


def gap_lines(s: dict) -> list[str]:
    window = s["window_ms"]
    lines = [f"Device idle: {s['gaps_ms']:.3f} ms ({pct(s['gaps_ms'], window):.1f}% of window).", ""]
    rows = [[name, f"{ms:.3f}", f"{pct(ms, window):.1f}"] for name, ms in s["gaps_by_class"].items()]
    lines += table(["host doing", "idle ms", "% of window"], rows) + [""]
    phase_ms = {p["name"]: p["ms"] for p in s["phases"]}
    rows = [
        [cell(name), f"{ms:.3f}", f"{pct(ms, phase_ms[name]):.1f}" if name in phase_ms else "-"]
        for name, ms in s["gaps_by_phase"].items()
    ]
    lines += table(["phase", "idle ms", "% of phase"], rows) + [""]
    lines += [
        "What the host ran while the device sat idle: each op's own time (its children's left out) "
        "inside the idle intervals, per thread (1: the thread with the most). Threads overlap, so "
        "the rows can sum to more than the idle time.",
        "",
    ]
    rows = [
        [
            op["thread"],
            op["cat"],
            cell(op["name"]),
            op["count"],
            f"{op['idle_ms']:.3f}",
            f"{pct(op['idle_ms'], window):.1f}",
        ]
        for op in s["idle_host_ops"]
    ]
    return lines + table(["thread", "kind", "op", "count", "idle ms", "% of window"], rows)


def host_op_lines(s: dict) -> list[str]:
    lines = ["No device events (kernel, gpu_memcpy, gpu_memset): a CPU-only trace; top host ops by self time.", ""]
    rows = [
        [cell(op["name"]), op["count"], f"{op['self_ms']:.3f}", f"{op['pct_of_window']:.1f}"] for op in s["host_ops"]
    ]
    return lines + table(["op", "count", "self ms", "% of window"], rows)


def render(path: str, s: dict) -> str:
    lines = [f"## {path}", "", f"Window: {s['window_ms']:.3f} ms ({s['window_source']}).", "", "### Phases", ""]
    lines += phase_lines(s) + [""]
    if s["has_device"]:
        lines += ["### Device", ""] + device_lines(s) + ["", "### Gaps (device idle)", ""] + gap_lines(s)
    else:
        lines += ["### Host ops", ""] + host_op_lines(s)
    return "\n".join(lines) + "\n"


def summarize(path: str, top: int = 15) -> str:
    """The markdown report of one trace file."""
    with gc_paused():
        events = load_events(path)
    try:
        numbers = summarize_events(events, top)
    except ValueError as err:
        raise SystemExit(f"{path}: {err}") from None
    return render(str(path), numbers)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1; give how many rows each table keeps")
    return int(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="trace files (.json or .json.gz) from export_chrome_trace")
    parser.add_argument("--top", type=positive_int, default=15, help="rows per table (default 15)")
    parser.add_argument("--out", help="write the markdown here instead of printing it")
    args = parser.parse_args(argv)
    report = "\n".join(summarize(path, args.top) for path in args.traces)
    if args.out:
        Path(args.out).write_text(report)
        print(f"wrote {args.out} ({len(args.traces)} trace(s))", file=sys.stderr)
    else:
        print(report, end="")


if __name__ == "__main__":
    main()
