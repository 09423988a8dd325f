"""One Chrome / Perfetto trace from the per-rank traces of a distributed run.

Under torchrun each rank is a process simulating its own device, and each writes its own
trace: :func:`fornax.sim.trace.chrome_trace` of its device, whose ``otherData`` also says
``rank``, ``world_size``, ``family``, ``node`` and ``backend``.  The ranks' simulated
clocks are reconciled at every collective (it starts at the latest rank's arrival and ends
at the same simulated time on every rank), so their timestamps share one time base and the
traces can be laid side by side.  :func:`merge` does that:

- one *process* per rank (``pid`` = rank + 1), named ``rank R · FAMILY · node K · device
  ...`` and sorted by rank; every event of a rank keeps its track (``tid``);
- *flow* events (``ph`` ``s`` / ``f``, bound to the enclosing slice) from the rank that
  arrived last at a collective to each rank that waited for it, so the UI draws an arrow
  between the slices of one collective (same ``group`` and ``seq``);
- a ``straggler`` instant on the engine track of the rank that arrived last, with how
  long each of the others waited;
- ``otherData``: the ranks, the world size, the family and :func:`summary`.

A rank's trace may carry an API call track (:func:`fornax.sim.trace.api_events`): its
events keep their tracks, and its flows get ids of their own in the merged trace.

A collective is an ``X`` event of category ``collective`` whose args carry ``collective``
(the family's call name), ``group``, ``seq``, ``bytes``, ``algorithm``, ``arrived_s``,
``latest_s`` and ``waited_s`` (simulated seconds).  Every packet appears twice in a rank's
trace, on its engine's track and on its queue's; only the engine track's copy is counted.
Point-to-point calls (``...Send``, ``...Recv``) count in their rank's communication time
and waits but are not paired: two disjoint pairs may share a sequence number.

:func:`summary` works from the trace events alone, so a merged file describes itself.
Every malformed input is a :class:`TraceMergeError` (a ``ValueError``) that says which
trace and what is wrong.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .trace import QUEUE_TID_BASE

SCHEMA = "fornax.trace-summary/1"
CLOCK = "simulated device time (µs)"
#: the args a collective's event must carry to be matched across the ranks
COLLECTIVE_ARGS = ("collective", "group", "seq", "arrived_s", "latest_s", "waited_s")
#: arrivals closer than this (simulated seconds) are simultaneous: no rank was last
SIMULTANEOUS_S = 1e-12
#: flow ids of a rank's API track (``cat`` ``api``) are offset by this times (rank + 1)
API_FLOW_BASE = 1_000_000_000

Interval = tuple[float, float]


class TraceMergeError(ValueError):
    """The traces given cannot be merged: what is wrong, in which trace, and what to do."""

    def __init__(self, message: str, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message} — {hint}")


@dataclass
class _Collective:
    """One rank's side of one collective (its engine-track event)."""

    rank: int
    group: str
    seq: int
    call: str
    nbytes: int | None
    algorithm: str | None
    arrived_s: float
    latest_s: float
    waited_s: float
    error: str | None
    event: dict[str, Any]

    @property
    def point_to_point(self) -> bool:
        return self.call.lower().endswith(("send", "recv"))


@dataclass
class _Rank:
    """One rank's trace, checked."""

    rank: int
    world_size: int
    family: str
    node: int | None
    backend: str | None
    device: str
    source: str
    events: list[dict[str, Any]]
    kernels: list[Interval] = field(default_factory=list)
    copies: list[Interval] = field(default_factory=list)
    communication: list[Interval] = field(default_factory=list)
    collectives: list[_Collective] = field(default_factory=list)
    end_s: float = 0.0


# -- intervals -------------------------------------------------------------------------------
def _union(intervals: Iterable[Interval]) -> list[Interval]:
    """Disjoint, sorted intervals covering the same time as ``intervals``."""
    out: list[Interval] = []
    for lo, hi in sorted(i for i in intervals if i[1] > i[0]):
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _length(intervals: Iterable[Interval]) -> float:
    return sum(hi - lo for lo, hi in intervals)


def _uncovered(intervals: list[Interval], cover: list[Interval]) -> float:
    """Time in ``intervals`` that ``cover`` does not cover (both disjoint and sorted)."""
    total, j = 0.0, 0
    for lo, hi in intervals:
        t = lo
        while j < len(cover) and cover[j][1] <= t:
            j += 1
        k = j
        while t < hi and k < len(cover) and cover[k][0] < hi:
            if cover[k][0] > t:
                total += cover[k][0] - t
            t = max(t, cover[k][1])
            k += 1
        if t < hi:
            total += hi - t
    return total


# -- reading and checking the ranks' traces --------------------------------------------------
def _number(value: Any, what: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceMergeError(f"{source}: {what} is {value!r}, not a number",
                              hint="the file is not a trace fornax wrote, or it was edited")
    return float(value)


def _whole(value: Any, what: str, source: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise TraceMergeError(f"{source}: otherData.{what} is {value!r}, not a whole number "
                              f">= {least}", hint="each rank writes its own rank and the world size")
    return value


def _read(doc: Any, source: str) -> _Rank:
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceMergeError(f"{source} is not a Chrome / Perfetto trace document (no traceEvents list)",
                              hint="pass the trace files the ranks wrote")
    other = doc.get("otherData")
    other = other if isinstance(other, dict) else {}
    if "rank" not in other:
        if "ranks" in other:
            raise TraceMergeError(f"{source} is a merged trace already",
                                  hint="merge the ranks' own traces")
        raise TraceMergeError(f"{source} has no otherData.rank: it is not one rank's trace",
                              hint="each rank of a distributed run writes its trace with otherData "
                                   "rank, world_size, family and node")
    rank = _whole(other["rank"], "rank", source, 0)
    world = _whole(other.get("world_size"), "world_size", source, 1)
    if rank >= world:
        raise TraceMergeError(f"{source}: rank {rank} is outside a world of {world}")
    node = other.get("node")
    events = doc["traceEvents"]
    if not all(isinstance(ev, dict) for ev in events):
        raise TraceMergeError(f"{source}: traceEvents holds something other than event objects")
    pids = {ev.get("pid") for ev in events if ev.get("ph") != "M" or ev.get("name") == "process_name"}
    if len(pids) > 1:
        raise TraceMergeError(f"{source} holds {len(pids)} devices (pids {sorted(map(str, pids))}); "
                              "a rank's trace holds its one device",
                              hint="write each rank's trace with chrome_trace([device])")
    device = next((str(ev["args"].get("name", "")) for ev in events if ev.get("ph") == "M"
                   and ev.get("name") == "process_name" and isinstance(ev.get("args"), dict)), "") or "device"
    r = _Rank(rank=rank, world_size=world, family=str(other.get("family") or "unknown"),
              node=node if isinstance(node, int) and not isinstance(node, bool) else None,
              backend=None if other.get("backend") is None else str(other["backend"]),
              device=device, source=source, events=events)
    for ev in events:
        if ev.get("ph") == "X":
            _classify(r, ev)
    return r


def _classify(r: _Rank, ev: dict[str, Any]) -> None:
    """Count an ``X`` event of rank ``r``: its engine track's copy only."""
    where = f"event {ev.get('name')!r}"
    start = _number(ev.get("ts"), f"{where} ts", r.source) / 1e6
    end = start + _number(ev.get("dur"), f"{where} dur", r.source) / 1e6
    r.end_s = max(r.end_s, end)
    tid = ev.get("tid")
    if not isinstance(tid, int) or tid >= QUEUE_TID_BASE:     # the queue track's copy
        return
    cat = ev.get("cat")
    if cat == "kernel":
        r.kernels.append((start, end))
    elif cat == "copy":
        r.copies.append((start, end))
    elif cat == "collective":
        r.communication.append((start, end))
        args = ev.get("args")
        if isinstance(args, dict) and all(k in args for k in COLLECTIVE_ARGS):
            seq = args["seq"]
            if isinstance(seq, bool) or not isinstance(seq, (int, float)) or seq != int(seq):
                raise TraceMergeError(f"{r.source}: {where} seq is {seq!r}, not a whole number")
            nbytes = args.get("bytes")
            r.collectives.append(_Collective(
                rank=r.rank, group=str(args["group"]), seq=int(seq), call=str(args["collective"]),
                nbytes=int(nbytes) if isinstance(nbytes, (int, float)) and not isinstance(nbytes, bool) else None,
                algorithm=None if args.get("algorithm") is None else str(args["algorithm"]),
                arrived_s=_number(args["arrived_s"], f"{where} arrived_s", r.source),
                latest_s=_number(args["latest_s"], f"{where} latest_s", r.source),
                waited_s=_number(args["waited_s"], f"{where} waited_s", r.source),
                error=None if args.get("error") is None else str(args["error"]), event=ev))


def _ranks(traces: Sequence[Any], sources: Sequence[str] | None) -> list[_Rank]:
    if not traces:
        raise TraceMergeError("no traces to merge", hint="pass every rank's trace")
    names = list(sources) if sources is not None else [f"trace {i}" for i in range(len(traces))]
    if len(names) != len(traces):
        raise ValueError(f"{len(traces)} traces but {len(names)} source names")
    ranks = [_read(doc, name) for doc, name in zip(traces, names)]
    seen: dict[int, _Rank] = {}
    for r in ranks:
        if r.rank in seen:
            raise TraceMergeError(f"rank {r.rank} appears twice: {seen[r.rank].source} and {r.source}",
                                  hint="pass each rank's trace once (from one run)")
        seen[r.rank] = r
    worlds = {r.world_size for r in ranks}
    if len(worlds) > 1:
        said = ", ".join(f"rank {r.rank} says {r.world_size}" for r in sorted(ranks, key=lambda r: r.rank))
        raise TraceMergeError(f"the traces disagree on the world size: {said}",
                              hint="pass the traces of one run")
    world = worlds.pop()
    missing = sorted(set(range(world)) - set(seen))
    if missing:
        raise TraceMergeError(
            f"world size {world} but rank{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(str, missing))} {'are' if len(missing) > 1 else 'is'} missing "
            f"(given rank{'s' if len(seen) > 1 else ''} {', '.join(map(str, sorted(seen)))})",
            hint="pass every rank's trace")
    return sorted(ranks, key=lambda r: r.rank)


# -- the collectives across the ranks ----------------------------------------------------------
@dataclass
class _Matched:
    """One collective (group, seq) as the ranks that issued it saw it."""

    group: str
    seq: int
    sides: list[_Collective]            # by rank
    expected: list[int]                 # the ranks that take part in the group

    @property
    def calls(self) -> dict[int, str]:
        return {c.rank: c.call for c in self.sides}

    @property
    def skew(self) -> float:
        arrivals = [c.arrived_s for c in self.sides]
        return max(arrivals) - min(arrivals)

    @property
    def last(self) -> _Collective | None:
        """The side that arrived last (None when all arrived together)."""
        if len(self.sides) < 2 or self.skew <= SIMULTANEOUS_S:
            return None
        return max(self.sides, key=lambda c: (c.arrived_s, -c.rank))


def _match(ranks: list[_Rank]) -> list[_Matched]:
    by_key: dict[tuple[str, int], list[_Collective]] = defaultdict(list)
    members: dict[str, set[int]] = defaultdict(set)
    for r in ranks:
        for c in r.collectives:
            if c.point_to_point:
                continue
            by_key[(c.group, c.seq)].append(c)
            members[c.group].add(c.rank)
    out = []
    for (group, seq), sides in sorted(by_key.items()):
        sides.sort(key=lambda c: c.rank)
        out.append(_Matched(group, seq, sides, sorted(members[group])))
    return out


def _summarise(ranks: list[_Rank], matched: list[_Matched]) -> dict[str, Any]:
    families = {r.rank: r.family for r in ranks}
    warnings = []
    if len(set(families.values())) > 1:
        warnings.append("the ranks run different families: " +
                        ", ".join(f"rank {k} {v}" for k, v in families.items()))
    stragglers: dict[int, list[float]] = defaultdict(list)      # rank -> the waits it caused
    collectives, unmatched, mismatched = [], [], []
    for m in matched:
        last = m.last
        waits = {c.rank: c.waited_s for c in m.sides}
        if last is not None:
            stragglers[last.rank].append(sum(w for k, w in waits.items() if k != last.rank))
        calls = sorted(set(m.calls.values()))
        call, present, first = " / ".join(calls), [c.rank for c in m.sides], m.sides[0]
        entry = {"group": m.group, "seq": m.seq, "call": call, "bytes": first.nbytes,
                 "algorithm": first.algorithm, "ranks": present,
                 "start_s": max(c.latest_s for c in m.sides),
                 "arrival_skew_s": m.skew, "last_rank": None if last is None else last.rank,
                 "total_wait_s": sum(waits.values()),
                 "failed_ranks": [c.rank for c in m.sides if c.error]}
        collectives.append(entry)
        missing = sorted(set(m.expected) - set(present))
        if missing:
            unmatched.append({"group": m.group, "seq": m.seq, "call": call,
                              "ranks": present, "missing_ranks": missing})
        if len(calls) > 1:
            mismatched.append({"group": m.group, "seq": m.seq,
                               "calls": {str(k): v for k, v in m.calls.items()}})
    rows = []
    for r in ranks:
        kernels, comm = _union(r.kernels), _union(r.communication)
        comm_s = _length(comm)
        exposed = _uncovered(comm, kernels)
        caused = stragglers.get(r.rank, [])
        rows.append({
            "rank": r.rank, "node": r.node, "family": r.family, "device": r.device,
            "kernels": len(r.kernels), "compute_s": _length(kernels),
            "copies": len(r.copies), "copy_s": _length(_union(r.copies)),
            "collectives": len(r.communication), "collective_s": comm_s,
            "point_to_point": sum(1 for c in r.collectives if c.point_to_point),
            "waiting_s": sum(c.waited_s for c in r.collectives),
            "exposed_s": exposed,
            "overlap": min(1.0, max(0.0, (comm_s - exposed) / comm_s)) if comm_s > 0 else None,
            "straggler": len(caused), "caused_wait_s": sum(caused),
            "end_s": r.end_s,
        })
    top = sorted(({"rank": k, "count": len(v), "caused_wait_s": sum(v)} for k, v in stragglers.items()),
                 key=lambda s: (-s["caused_wait_s"], -s["count"], s["rank"]))
    return {"schema": SCHEMA, "clock": "simulated device time (s)", "world_size": ranks[0].world_size,
            "family": families[ranks[0].rank] if len(set(families.values())) == 1 else "mixed",
            "ranks": rows, "collectives": collectives, "stragglers": top,
            "unmatched": unmatched, "mismatched": mismatched, "warnings": warnings}


def summary(traces: Sequence[Any], sources: Sequence[str] | None = None) -> dict[str, Any]:
    """What the ranks' traces say about the run (seconds of simulated time).

    ``ranks``: per rank its busy time in compute kernels (``compute_s``), copies
    (``copy_s``) and collectives (``collective_s``, waiting included), the time it waited in
    collectives (``waiting_s``, the sum of ``waited_s``), the collective time no compute
    kernel overlapped (``exposed_s``), the overlapped fraction (``overlap``; None without
    collectives) and how often it arrived last (``straggler``, and the waits it caused).
    ``collectives``: per (group, seq) the call, bytes, ranks, arrival skew and last rank.
    ``unmatched``: collectives some of their group's ranks never issued (what a hang leaves).
    ``mismatched``: one (group, seq) under different calls.  ``sources`` names the traces in
    errors (file names); by default ``trace 0``, ``trace 1``, ...
    """
    ranks = _ranks(traces, sources)
    return _summarise(ranks, _match(ranks))


# -- the merged trace ----------------------------------------------------------------------------
def _process_name(r: _Rank) -> str:
    node = "" if r.node is None else f" · node {r.node}"
    return f"rank {r.rank} · {r.family}{node} · {r.device}"


def _inside(ev: dict[str, Any], at_us: float) -> float:
    """``at_us`` if it lies inside ``ev``'s slice, else the slice's middle."""
    lo, hi = float(ev["ts"]), float(ev["ts"]) + float(ev["dur"])
    return at_us if lo <= at_us <= hi else (lo + hi) / 2


def _transfer_middle(c: _Collective) -> float:
    """A time inside the transfer (after the latest arrival) of ``c``'s slice, in µs."""
    ev = c.event
    end = float(ev["ts"]) + float(ev["dur"])
    return _inside(ev, (c.latest_s * 1e6 + end) / 2)


def _links(matched: list[_Matched]) -> list[dict[str, Any]]:
    """Flow arrows from the last rank to each other rank, and the straggler instants."""
    out: list[dict[str, Any]] = []
    flow = 0
    for m in matched:
        if len(m.sides) < 2:
            continue
        last = m.last
        src = last or m.sides[0]
        name = " / ".join(sorted(set(m.calls.values())))
        for c in m.sides:
            if c is src:
                continue
            flow += 1
            for side, ph in ((src, "s"), (c, "f")):
                out.append({"ph": ph, "id": flow, "name": name, "cat": "collective", "bp": "e",
                            "pid": side.rank + 1, "tid": side.event["tid"], "ts": _transfer_middle(side),
                            "args": {"group": m.group, "seq": m.seq}})
        if last is not None:
            waited = {str(c.rank): c.waited_s for c in m.sides if c is not last}
            out.append({"ph": "i", "name": "straggler", "cat": "straggler", "s": "t",
                        "pid": last.rank + 1, "tid": last.event["tid"],
                        "ts": _inside(last.event, last.arrived_s * 1e6),
                        "args": {"seq": m.seq, "group": m.group, "call": name, "rank": last.rank,
                                 "waited_s": waited, "max_wait_s": max(waited.values()),
                                 "total_wait_s": sum(waited.values())}})
    return out


def merge(traces: Sequence[Any], sources: Sequence[str] | None = None) -> dict[str, Any]:
    """One trace of every rank: a process per rank, flows joining each collective across the
    ranks, a ``straggler`` instant where a rank arrived last, and :func:`summary` in
    ``otherData``.  ``sources`` names the traces in errors (file names)."""
    ranks = _ranks(traces, sources)
    matched = _match(ranks)
    events: list[dict[str, Any]] = []
    for r in ranks:
        pid = r.rank + 1
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": _process_name(r)}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": r.rank}})
        for ev in r.events:
            if ev.get("ph") == "M" and ev.get("name") in ("process_name", "process_sort_index"):
                continue
            if ev.get("cat") == "api" and ev.get("ph") in ("s", "t", "f") and isinstance(ev.get("id"), int):
                # a rank's API-track flows keep their own ids, apart from every other rank's
                # and from the collective flows (numbered from 1 here)
                ev = {**ev, "id": API_FLOW_BASE * (r.rank + 1) + ev["id"]}
            events.append({**ev, "pid": pid})
    events.extend(_links(matched))
    backends = sorted({r.backend for r in ranks if r.backend})
    summ = _summarise(ranks, matched)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"clock": CLOCK, "ranks": [r.rank for r in ranks],
                          "world_size": summ["world_size"], "family": summ["family"],
                          "nodes": {str(r.rank): r.node for r in ranks},
                          "backend": " / ".join(backends) or None,
                          "summary": summ}}
