"""The summary of a recording, as a family's profiler prints it: top kernels (share of
kernel time, total, instances, average, minimum, maximum), API time per call, copies per
direction (count, bytes, time) and per-kernel metrics under the family's metric names.

:func:`summarize` returns plain JSON values (the ``fornax.profile/1`` document's body);
times are nanoseconds of simulated time.  The section titles and column labels are the
family's (``[profiler.summary]``), so one renderer prints an nsys-like, rocprofv3-like or
unitrace-like report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from .metrics import KEYS
from .recorder import Recorder
from .vocabulary import Vocabulary

SCHEMA = "fornax.profile/1"


def _stats(durations: list[float], whole: float) -> dict[str, float]:
    total = sum(durations)
    return {"count": len(durations), "total_ns": total, "pct": 100.0 * total / whole if whole > 0 else 0.0,
            "avg_ns": total / len(durations), "min_ns": min(durations), "max_ns": max(durations)}


def _rows(groups: dict[Any, list[float]]) -> list[tuple[Any, dict[str, float]]]:
    whole = sum(sum(v) for v in groups.values())
    rows = [(key, _stats(v, whole)) for key, v in groups.items()]
    rows.sort(key=lambda r: (-r[1]["total_ns"], str(r[0])))
    return rows


def _metric_names(vocab: Vocabulary) -> dict[str, dict[str, str]]:
    out = {}
    for key in KEYS:
        named = vocab.metric_unit(key)
        if named is not None:
            out[key] = {"name": named[0], "unit": named[1]}
    return out


def summarize(recorder: Recorder, vocab: Vocabulary, top: int | None = None) -> dict[str, Any]:
    """What ``recorder`` holds, summarised in ``vocab``'s names; ``top`` keeps the first
    kernels (by total time) in ``kernels`` and ``metrics`` (None: all)."""
    kernels: dict[str, list[float]] = defaultdict(list)
    values: dict[str, list[dict[str, float]]] = defaultdict(list)
    for k in recorder.kernels:
        kernels[k.name].append(k.duration_s * 1e9)
        values[k.name].append(k.metrics)
    kernel_rows = [{"name": name, **s} for name, s in _rows(kernels)]
    api: dict[tuple[str, str], list[float]] = defaultdict(list)
    wall: dict[tuple[str, str], int] = defaultdict(int)
    for a in recorder.api:
        api[(a.domain, a.name)].append((a.end_s - a.start_s) * 1e9)
        wall[(a.domain, a.name)] += a.wall_ns
    api_rows = [{"domain": d, "domain_name": vocab.domains[d], "name": n, **s, "wall_ns": wall[(d, n)]}
                for domain in ("runtime", "driver")       # shares are of the domain's time
                for (d, n), s in _rows({k: v for k, v in api.items() if k[0] == domain})]
    copies: dict[str, list[float]] = defaultdict(list)
    moved: dict[str, int] = defaultdict(int)
    for c in recorder.copies:
        copies[c.direction].append(c.duration_s * 1e9)
        moved[c.direction] += c.bytes
    names = vocab.summary["copy_names"]
    copy_rows = [{"direction": d, "name": names[d], "bytes": moved[d], **s} for d, s in _rows(copies)]
    shown = kernel_rows if top is None else kernel_rows[:top]
    metrics = []
    for row in shown:
        samples = values[row["name"]]
        avg = {key: sum(m.get(key, 0.0) for m in samples) / len(samples) for key in KEYS}
        metrics.append({"kernel": row["name"], "instances": len(samples), "values": avg,
                        "named": vocab.metrics(avg)})
    linked = {a.correlation for a in recorder.api}
    return {
        "schema": SCHEMA,
        "family": vocab.vendor,
        "interface": vocab.api,
        "tool": vocab.summary["tool"],
        "metrics_tool": vocab.summary["metrics_tool"],
        "clock": "simulated time (ns)",
        "kernel_time_ns": sum(r["total_ns"] for r in kernel_rows),
        "copy_time_ns": sum(r["total_ns"] for r in copy_rows),
        "kernels": shown,
        "kernels_total": len(kernel_rows),
        "api": api_rows,
        "copies": copy_rows,
        "metrics": metrics,
        "metric_names": _metric_names(vocab),
        "sections": {s: {"title": vocab.summary[s]["title"],
                         "columns": [list(c) for c in vocab.summary[s]["columns"]]}
                     for s in ("kernels", "api", "copies")},
        "correlated": {"kernels": sum(1 for k in recorder.kernels if k.correlation in linked),
                       "copies": sum(1 for c in recorder.copies if c.correlation in linked)},
        "dropped": dict(recorder.dropped),
    }


def cell(row: dict[str, Any], column: str) -> str:
    """One cell of a summary table: ``column`` is a generic column name."""
    if column == "name":
        return str(row["name"])
    if column == "count":
        return str(row["count"])
    if column == "pct":
        return f"{row['pct']:.1f}"
    if column == "bytes":
        return f"{row.get('bytes', 0) / 1e6:.3f}"
    return f"{row[column + '_ns']:,.0f}"


def table(rows: Iterable[dict[str, Any]], columns: list[list[str]]) -> list[list[str]]:
    """The cells of a section's rows, in the family's column order."""
    return [[cell(r, c[0]) for c in columns] for r in rows]
