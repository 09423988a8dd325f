"""Lab 3: driver, runtime and memory -- from discovery to submission.

Experiments: the calls from device discovery to a first launch on each family and what the
driver counts for them; a two-stream program whose reader copies a buffer the writer kernel
writes, without and with an event wait (the happens-before race detector's report, and the
timeline of both); managed memory touched by a kernel (page migrations) beside an
injected hang (the watchdog's error), as ``fornax drill`` runs them; one chip split into
partitions for several tenants, and what a fault in one does to another
(:mod:`.lab03_tenants`); and one launch profiled through each family's own profiling
interface (:mod:`.lab03_profiling`).

Exercise 3.5 imports the student's own ``race.py`` and runs it, deliberately, as a test
would: on a fresh stack of each family, checked by the race detector and the data read back.
"""

from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from . import lab03_profiling, lab03_tenants
from .lab import Exercise, Lab, Section, Table, figure, number_fact, text_fact

FAMILIES = ("cuda-like", "rocm-like", "xpu-like")
N = 64                                         # float32 elements of the two-stream program
OLD = np.full(N, -7.0, np.float32)             # what dst holds before the writer runs
SRC = np.arange(N, dtype=np.float32) + 1
NEW = SRC * 3                                  # what the writer stores in dst
#: (what the step is, the driver call's key) from discovery to a first launch
#: (the first key the family's driver names is its call; a primary context where there is one)
CALLS = (("discover", ("device_get",)), ("context", ("set_device", "create_context")),
         ("allocate", ("allocate",)), ("upload", ("copy_h2d",)), ("load module", ("load_module",)),
         ("stream", ("create_queue",)), ("launch", ("launch",)), ("wait", ("synchronize",)))
COUNTS = ("contexts", "allocations", "copies", "modules_loaded", "jit_compiles", "il_builds", "launches")

STARTER_RACE = '''"""Lab 3, exercise 3.5: fix the cross-stream race.

`fornax lab check 3` imports this file and calls run(runtime, module, src, dst, n) on a fresh
stack of each family (it runs your code, as a test would):

- runtime: the family's runtime seam (fornax/layers/runtime: create_stream, launch,
  memcpy_d2h, record_event, stream_wait_event, synchronize, ...);
- module: a loaded module whose kernel "scale3" computes dst[i] = src[i] * 3 (grid (1, 1, 1),
  arguments {"src": ..., "dst": ...});
- src, dst: device addresses of n float32 each; src holds 1..n, dst holds -7 (old contents).

run returns the n floats the reader stream copied back from dst.  It passes when they are
src * 3 and the race detector reports no race.
"""

import numpy as np


def run(runtime, module, src, dst, n):
    writer = runtime.create_stream(in_order=True)
    reader = runtime.create_stream(in_order=True)
    runtime.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst}, writer)
    # FIX HERE: nothing orders the reader's copy after the writer's kernel, so the copy can
    # read dst before the kernel has written it (and the race detector says so).
    out = np.zeros(n, np.float32)
    runtime.memcpy_d2h(out, dst, reader, blocking=False)
    runtime.synchronize()
    return out
'''


# -- the fresh stack every experiment and the race.py check run on ----------------------------------
def _bench(family: str) -> tuple[Any, Any, int, int]:
    """A freshly composed stack of ``family`` on the tiny spec, a module with scale3 loaded
    through its runtime, src = 1..N and dst = -7 on the device, the host synchronised."""
    from fornax.layers.compiler import Target
    from fornax.sim import isa
    from fornax.stack import compose, make_config
    stack = compose(make_config(family, spec="tiny"))
    rt, drv = stack.runtime, stack.driver
    prog = isa.verify(isa.Program("scale3", (isa.Param("src", "ptr", "float32"),
                                             isa.Param("dst", "ptr", "float32")), (
        isa.Arange("%i", N), isa.Load("%v", "src", "%i"), isa.Const("%f", 3.0, "float32"),
        isa.Binary("%w", "mul", "%v", "%f"), isa.Store("dst", "%i", "%w")), {"group_size": 64}))
    props = drv.properties(0)
    comp: Any = stack.compiler              # every family's compiler emits programs (the protocol omits it)
    fmt = next(f for f in comp.output_formats() if f in drv.loadable_formats(0))
    image = comp.emit([prog], Target(props.target, fmt, props.compute_units))
    src, dst = rt.malloc(4 * N), rt.malloc(4 * N)
    rt.memcpy(src, SRC)
    rt.memcpy(dst, OLD)
    module = rt.load_module(image)
    rt.synchronize()
    return stack, module, src, dst


def _two_streams(rt: Any, module: Any, src: int, dst: int, wait: bool) -> tuple[np.ndarray, Any, Any]:
    """The writer kernel on one stream, the reader copy on another; ``wait``: the reader's
    stream waits for an event recorded after the kernel."""
    writer, reader = rt.create_stream(in_order=True), rt.create_stream(in_order=True)
    rt.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst}, writer)
    if wait:
        rt.stream_wait_event(reader, rt.record_event(writer))
    out = np.zeros(N, np.float32)
    rt.memcpy_d2h(out, dst, reader, blocking=False)
    rt.synchronize()
    return out, writer, reader


def _describe_race(race: Any, dst: int) -> dict[str, str]:
    """A race without raw addresses: its kind, both sides, and the bytes of dst it covers."""
    d = race.to_dict()
    lo, hi = d["range"]
    side = [f"{s['kind']} '{s['label']}' {s['access']}s "
            f"{'its ' + ('source' if s['param'] == 'src' else 'destination') if s['kind'] == 'copy' else s['param']}"
            f" on queue {s['queue']}" for s in (d["first"], d["second"])]
    return {"kind": d["kind"], "first": side[0], "second": side[1],
            "bytes": f"dst[{lo - dst}:{hi - dst}] ({d['bytes']} B)"}


@lru_cache(maxsize=1)
def _first_launch() -> tuple[tuple[str, dict[str, str], dict[str, int]], ...]:
    """Per family: the driver's names for the calls to a first launch, and its counts after it."""
    rows = []
    for fam in FAMILIES:
        stack, module, src, dst = _bench(fam)
        _two_streams(stack.runtime, module, src, dst, wait=True)
        drv = stack.driver
        rows.append((fam, {step: next((drv.calls[k] for k in keys if k in drv.calls), keys[0])
                           for step, keys in CALLS},
                     {k: int(drv.counts[k]) for k in COUNTS}))
    return tuple(rows)


@lru_cache(maxsize=1)
def _races() -> tuple[tuple[str, bool, str, list[dict[str, str]], list[tuple[str, int, float, float]]], ...]:
    """Per family and with/without the wait: the data read back (as text), the races, and the
    two streams' records (label, queue, start, end) for the picture."""
    rows = []
    for fam in FAMILIES:
        for wait in (False, True):
            stack, module, src, dst = _bench(fam)
            out, writer, reader = _two_streams(stack.runtime, module, src, dst, wait)
            dev = stack.devices[0]
            read = "src * 3 (fresh)" if np.array_equal(out, NEW) else \
                ("-7 (stale)" if np.array_equal(out, OLD) else "mixed")
            queues = {writer.queue.hwq.id, reader.queue.hwq.id}
            recs = [(r.label, r.queue, r.start, r.end) for r in dev.timeline.records if r.queue in queues]
            rows.append((fam, wait, read, [_describe_race(r, dst) for r in dev.races], recs))
    return tuple(rows)


@lru_cache(maxsize=1)
def _drill() -> tuple[tuple[str, str, int, int, str, str], ...]:
    """Per family: managed-memory policy, migrations, remote bytes; the hang's code, recovery."""
    from fornax.scenarios.drill import drill_row
    rows = []
    for fam in FAMILIES:
        mig = drill_row("migration", fam, "graph")
        hang = drill_row("hang", fam, "graph")
        moved = re.search(r"(\d+) page migration", mig.detail)
        remote = re.search(r"(\d+) bytes read over", mig.detail)
        policy = mig.expected[0].split(": ", 1)[1] if mig.expected else "?"
        rows.append((fam, policy, int(moved.group(1)) if moved else 0, int(remote.group(1)) if remote else 0,
                     str(hang.code), hang.recovery))
    return tuple(rows)


def experiments(out: Path) -> list[Section]:
    first, races, drill = _first_launch(), _races(), _drill()
    _picture(races, out / "two-streams.png")
    race_rows = []
    for fam, wait, read, found, _ in races:
        if not found:
            race_rows.append([fam, "yes" if wait else "no", read, "none", "", "", ""])
        for r in found:
            race_rows.append([fam, "yes" if wait else "no", read, r["kind"], r["first"], r["second"], r["bytes"]])
    return [
        Section("From discovery to a first launch",
                f"A fresh stack of each family on the tiny spec: find the device, make its (primary) "
                f"context, allocate two buffers of {N} floats, upload them, load a module with one kernel "
                "(scale3: dst = src * 3), launch it on a stream and copy the result back. The runtime "
                "makes every driver call; these are the driver's names for them and what its report "
                "counts at the end (the caching allocator maps one block for both buffers; a module "
                "in an IL or virtual ISA is compiled by the driver when it loads).",
                [Table("the driver calls, per family", ["family", *(s for s, _ in CALLS)],
                       [[fam, *calls.values()] for fam, calls, _ in first]),
                 Table("what the driver counts after the first launch", ["family", *COUNTS],
                       [[fam, *(str(c[k]) for k in COUNTS)] for fam, _, c in first])]),
        Section("A cross-stream race, and the event that fixes it",
                "The scale3 kernel writes dst on a writer stream; a reader stream copies dst back to "
                "the host. Without an event wait nothing orders the copy after the kernel: on the "
                "simulated device the copy engine starts at once, reads the old contents, and the "
                "happens-before race detector (fornax/sim/race.py; a run's races are in its report) "
                "names both packets. With `record_event(writer)` and `stream_wait_event(reader, "
                "event)` the copy starts when the kernel ends (rocm-like turns the wait into a "
                "barrier-AND packet on the reader's queue): fresh data, no race. Byte ranges are "
                "given relative to dst.",
                [Table("two streams, with and without the wait", ["family", "event wait", "reader got",
                                                                 "race", "first", "second", "bytes"],
                       race_rows)], ["two-streams.png"]),
        Section("Page migration is not a hang",
                "Two rows of `fornax drill` per family. A kernel over managed memory the host wrote "
                "(cuMemAllocManaged-like) is slow the first time -- its pages migrate to the device, "
                "or the device reads them over the host link where the family's policy is remote -- "
                "but completes, and the driver report counts it (managed_migrations_h2d, "
                "managed_remote_bytes). An injected hang never completes: the watchdog fires after "
                "its simulated timeout and the family raises its own code, then recovers its way.",
                [Table("managed memory vs a hang", ["family", "managed policy", "page migrations",
                                                   "remote bytes", "hang raises", "recovery"],
                       [[f, p, str(m), str(r), c, rec] for f, p, m, r, c, rec in drill])]),
        lab03_tenants.section(),
        lab03_profiling.section(_bench, N, FAMILIES),
    ]


def _picture(races: Any, path: Path) -> None:
    fig = figure(7, 3.4)
    axes = fig.subplots(2, 1, sharex=True)
    rows = [r for r in races if r[0] == FAMILIES[0]]
    for ax, (fam, wait, _read, found, recs) in zip(axes, rows):
        queues = sorted({q for _, q, _, _ in recs})
        names = {q: n for q, n in zip(queues, ("writer", "reader"))}
        for label, q, start, end in recs:
            y = queues.index(q)
            ax.barh(y, max(end - start, 1e-8) * 1e6, left=start * 1e6, height=0.5,
                    color="C0" if label == "scale3" else ("C2" if label.startswith("d2h") else "C7"))
            ax.text(start * 1e6, y + 0.32, label, fontsize=7)
        ax.set_yticks(range(len(queues)), [names[q] for q in queues])
        ax.set_ylim(-0.5, len(queues) - 0.2)
        ax.set_title(f"{fam}, {'with' if wait else 'without'} the event wait: "
                     f"{len(found)} race{'s' if len(found) != 1 else ''}", fontsize=9)
    axes[-1].set_xlabel("simulated time (µs)")
    fig.savefig(path, format="png", dpi=90)


def facts() -> dict[str, Any]:
    first, races, drill = _first_launch(), _races(), _drill()
    jit = [fam for fam, _, c in first if c["jit_compiles"] > 0]
    racy = next(found for fam, wait, _, found, _ in races if fam == "cuda-like" and not wait)
    return {"jit_family": jit[0] if len(jit) == 1 else ", ".join(jit),
            "race_kind": racy[0]["kind"] if racy else "none",
            "cuda_migrations": next(m for f, _, m, _, _, _ in drill if f == "cuda-like"),
            "xpu_hang_code": next(c for f, _, _, _, c, _ in drill if f == "xpu-like"),
            **lab03_tenants.facts()}


def _load_run(path: Path) -> Any:
    """The student's ``run`` from ``path`` (their code, imported and run as a test would)."""
    spec = importlib.util.spec_from_file_location(f"fornax_lab03_race_{abs(hash(str(path)))}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = getattr(mod, "run", None)
    if not callable(fn):
        raise TypeError("race.py defines no function run(runtime, module, src, dst, n)")
    return fn


def _check_race(answers: dict[str, Any], folder: Path, facts: dict[str, Any]) -> tuple[bool, str, str]:
    """race.py runs the two-stream program race-free with fresh data on every family."""
    want = "no race and dst == src * 3 read back, on every family"
    path = folder / "race.py"
    if not path.is_file():
        return False, want, "no race.py"
    try:
        run = _load_run(path)
    except Exception as exc:         # noqa: BLE001 - the student's module may raise anything
        return False, want, f"race.py does not import: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    seen = []
    for fam in FAMILIES:
        try:
            stack, module, src, dst = _bench(fam)
            got = np.asarray(run(stack.runtime, module, src, dst, N))
            stack.runtime.synchronize()
        except Exception as exc:     # noqa: BLE001 - the student's code may raise anything
            msg = str(exc).splitlines()[0][:160] if str(exc) else ""
            return False, want, f"{fam}: run raised {type(exc).__name__}: {msg}"
        races = stack.devices[0].races
        if races:
            r = _describe_race(races[0], dst)
            return False, want, (f"{fam}: the race detector reports {len(races)} race(s): {r['kind']}, "
                                 f"{r['first']} and {r['second']}, over {r['bytes']}")
        if got.shape != (N,) or not np.array_equal(got.astype(np.float32), NEW):
            head = ", ".join(f"{x:g}" for x in got.ravel()[:3].astype(float))
            return False, want, f"{fam}: no race, but run returned [{head}, ...] (shape {got.shape})"
        seen.append(fam)
    return True, want, f"no race and fresh data on {', '.join(seen)}"


LAB = Lab(
    number=3, slug="03-driver-runtime-memory", title="Driver, runtime and memory", part="Part 3",
    goal="Follow a program from device discovery to its first launch through the runtime and driver "
         "seams of each family, find and fix a cross-stream race the race detector reports, tell "
         "managed-memory page migration from a hang, see what a fault in one partition of a chip does "
         "to its neighbour, and profile a launch through each family's own profiling interface.",
    minutes=40, experiments=experiments, facts=facts,
    exercises=[
        Exercise("3.1", "Which family's driver counts a JIT compile (jit_compiles) when it loads the "
                 "module (cuda-like, rocm-like or xpu-like)?", text_fact("3.1", "jit_family"),
                 "the driver seam's load_module and the family's binary format (vendor.toml [compiler])"),
        Exercise("3.2", "What kind of race does the detector report for the program without the event "
                 "wait (its `kind`, e.g. write-write)?", text_fact("3.2", "race_kind"),
                 "fornax/sim/race.py: which packet reads and which writes the overlapping bytes"),
        Exercise("3.3", "How many page migrations to the device does the managed-memory kernel cause on "
                 "cuda-like?", number_fact("3.3", "cuda_migrations"),
                 "the driver report's managed_migrations_h2d (fornax/layers/driver/managed.py)"),
        Exercise("3.4", "Which error code does xpu-like raise when the watchdog fires on a hang?",
                 text_fact("3.4", "xpu_hang_code"),
                 "the hang row of `fornax drill` and xpu_like/vendor.toml [errors]"),
        Exercise("3.5", "Fix race.py (in this folder, written by `fornax lab new`): its run(runtime, "
                 "module, src, dst, n) must read back src * 3 with no race on every family. The check "
                 "imports your race.py and runs it, deliberately, as a test would.", _check_race,
                 "the runtime's events: record_event on the writer's stream, stream_wait_event on the "
                 "reader's (fornax/layers/runtime/events.py)", points=2),
        Exercise("3.6", "Split each family's chip as section 4 does. Which family's chip keeps an "
                 "uncorrectable ECC error the hardware contained on partition 0 inside that "
                 "partition, leaving partition 1 running (cuda-like, rocm-like or xpu-like)?",
                 text_fact("3.6", "contained_ecc_family"),
                 "each chip spec's [partitions] fault table (fornax/sim/specs/*.toml) and "
                 "`fornax drill --partition`"),
        Exercise("3.7", "On the MIG-like chip, is partition 1 running or down while partition 0 has "
                 "an uncontained ECC error (answer running or down)?",
                 text_fact("3.7", "mig_uncontained_neighbour"),
                 "the mode's `uncontained` scope in h100-like.toml [partitions] (fornax/sim/chip.py)"),
    ],
    starter_files={"race.py": STARTER_RACE})
