"""Fault drill: every injectable fault x every family x every front end, each detected,
recovered the way that family recovers, and checked against a clean run.

For one row (fault, family, front end) on a freshly composed stack:

1. **clean**: the front end's workload runs; its outputs and the allocator's state
   (allocated and reserved bytes after ``empty_cache``, device bytes mapped) are the baseline;
2. **fault**: the fault is injected (``fornax.sim.faults``; out-of-memory comes from a
   co-tenant context that holds almost all of the device) and the workload runs again —
   *detected* when it raises the family's exact code for that fault (a corrected ECC error
   raises nothing: it is detected when the device counts it);
3. **recover**, as the family does: a fault the family's driver makes *sticky* destroys the
   context and makes a new one, a fault that *loses* the device resets it first (both through
   the front end: ``Session.reset_device``, ``Client.reset_device``, the runtime's
   ``device_reset``); out-of-memory releases the co-tenant and the cache and retries; a
   corrected error needs nothing;
4. **rerun**: the workload runs once more — *identical* when every output is bit-identical to
   the clean run, *recovered* when it ran and the allocator is back at its baseline.

On a partitioned chip (``partition``: a layout, :mod:`fornax.sim.partition`) the workload
runs on partition 0 and a second tenant runs the same work on partition 1 in a context of
its own, before the fault, while partition 0 is faulted, and after recovery.  The chip's
partition mode says where each fault lands: a fault whose scope is the *partition* must
leave the neighbour running with identical results and no other partition lost; a fault
whose scope is the *device* must take every partition down (the neighbour's work fails
too) until the chip is reset, after which both run again.  ``ecc_uncontained`` drills an
uncorrectable ECC error the hardware could not contain (MIG's full-GPU-reset case).

Managed-memory migration is drilled beside the faults, because Part 3 of the series asks
for the two to be told apart: a kernel over managed memory that the host wrote faults its
pages over (or, on a family whose migration needs a target feature the chip lacks, reads
them over the host link), reports the migrations and their time and completes; a hang
reports the watchdog.  Managed memory is reached through the runtime and driver seams, so
that row runs on the graph front end only.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, cast

import numpy as np

from ..layers.errors import FornaxError
from ..layers.graph import DType, Graph
from ..sim.faults import FAULT_KINDS, FaultPlan, FaultSpec
from ..stack import Stack, compose, make_config, runnable_vendors

SCHEMA = "fornax.drill/1"
FAULTS = (*FAULT_KINDS, "out_of_memory", "migration")
#: the faults a partitioned drill adds: an uncorrectable ECC error the hardware could not contain
PARTITION_FAULTS = ("ecc_uncontained",)
FRONT_ENDS = ("graph", "torch", "jax")
N = 512                       # elements of the drill workload


def _inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(N).astype(np.float32) for _ in range(3)]


# -- the workload, once per front end: out = exp(-relu(x * w + b)) ---------------------------------
class _Front(Protocol):
    """One front end's drill workload on a stack."""

    def run(self) -> list[np.ndarray]:
        """Run the workload; its outputs on the host."""
        ...

    def reset(self, reason: str) -> None:
        """Reset the device through the front end after ``reason`` left it unusable."""
        ...


class _GraphFront:
    def __init__(self, stack: Stack):
        self.stack = stack
        g = Graph("drill")
        x, w, b = (g.input(n, (N,), DType.FLOAT32) for n in ("x", "w", "b"))
        g.output(g.op("exp", g.op("neg", g.op("relu", g.op("add", g.op("mul", x, w), b)))),
                 names=["out"])
        self.graph, self.feeds = g, dict(zip(("x", "w", "b"), _inputs()))

    def run(self) -> list[np.ndarray]:
        # a drill stack is never shape-only: its outputs are arrays
        return cast("list[np.ndarray]", self.stack.run(self.graph, self.feeds).outputs)

    def reset(self, reason: str) -> None:
        self.stack.runtime.device_reset(0)


class _TorchFront:
    def __init__(self, stack: Stack):
        import torch

        import fornax.frameworks.torch as ft
        self.torch = torch
        self.session = ft.use_stack(stack=stack)
        self.host = [torch.from_numpy(a) for a in _inputs()]

    def run(self) -> list[np.ndarray]:
        torch = self.torch
        x, w, b = (t.to("fornax") for t in self.host)
        out = torch.exp(-torch.relu(x * w + b))
        return [out.cpu().numpy()]

    def reset(self, reason: str) -> None:
        self.session.reset_device(reason)


class _JaxFront:
    def __init__(self, stack: Stack):
        import jax.numpy as jnp

        from ..frameworks.jax import Client
        self.client = Client(stack, "fornax drill")
        self.host = _inputs()
        self.exe = self.client.compile(lambda x, w, b: jnp.exp(-jnp.maximum(x * w + b, 0)),
                                       *self.host, name="drill")

    def run(self) -> list[np.ndarray]:
        bufs = [self.client.buffer_from_pyval(a) for a in self.host]
        return [o.to_numpy() for o in self.exe.execute(bufs)]

    def reset(self, reason: str) -> None:
        self.client.reset_device(reason)


FRONTS: dict[str, Callable[[Stack], _Front]] = {"graph": _GraphFront, "torch": _TorchFront, "jax": _JaxFront}


class _Neighbour:
    """Another tenant on partition ``index`` of the same chip: the drill workload driven at
    the driver, in a context of its own made for each run (and destroyed after it)."""

    def __init__(self, stack: Stack, index: int):
        g = _GraphFront(stack)
        self.stack, self.index = stack, index
        self.plan = stack.compiler.compile(g.graph, stack.target)
        self.feeds = list(g.feeds.values())

    def run(self) -> list[np.ndarray]:
        drv = self.stack.driver
        ctx = drv.create_context(self.index)
        if drv.context_rule == "thread":
            drv.pop_current()                  # another process's context: not this thread's
        try:
            step = self.plan.kernel_steps()[0]
            assert self.plan.binary is not None, "the drill graph compiles to a kernel"
            ptrs = {n: drv.allocate(ctx, N * 4, "managed") for n in ("in0", "in1", "in2", "out0")}
            for n, arr in zip(("in0", "in1", "in2"), self.feeds):
                drv.host_write(ctx, ptrs[n], arr)
            module = drv.load_module(ctx, self.plan.binary)
            q = drv.create_queue(ctx)
            q.launch(module, step.entry, step.grid, {p: ptrs[p] for p in step.args})
            q.synchronize()
            return [np.frombuffer(drv.host_read(ctx, ptrs["out0"], N * 4), np.float32).copy()]
        finally:
            if ctx.live:
                drv.destroy_context(ctx)


# -- one row ------------------------------------------------------------------------------------------
@dataclass
class DrillRow:
    fault: str
    family: str
    front_end: str
    code: str | None = None            # the vendor code raised (None: nothing raised)
    expected: list = field(default_factory=list)   # the family's code(s) for this fault
    recovery: str = ""                 # what the drill did to recover
    detected: bool = False
    recovered: bool = False
    identical: bool = False
    detail: str = ""
    #: on a partitioned chip: the layout, where the fault landed (``scope``), what the
    #: neighbour partition saw, and whether that is what the mode says (``isolated``)
    partition: dict | None = None

    @property
    def ok(self) -> bool:
        held = self.partition is None or self.partition["isolated"]
        return self.detected and self.recovered and self.identical and held

    def to_dict(self) -> dict:
        out: dict[str, object] = {"fault": self.fault, "family": self.family, "front_end": self.front_end,
               "code": self.code, "expected": list(self.expected), "recovery": self.recovery,
               "detected": self.detected, "recovered": self.recovered,
               "identical": self.identical, "ok": self.ok, "detail": self.detail}
        if self.partition is not None:
            out["partition"] = dict(self.partition)
        return out


def _fornax_error(exc: BaseException) -> FornaxError | None:
    seen = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, FornaxError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _allocator_state(stack: Stack, front_end: str = "graph") -> tuple[int, int, int]:
    if front_end != "graph":       # tensors and buffers in reference cycles die only here
        gc.collect()
    rt = stack.runtime
    rt.synchronize()
    rt.empty_cache()
    stats = rt.memory_stats()
    return (int(stats["allocated_bytes"]), int(stats["reserved_bytes"]),
            stack.devices[0].memory.used)


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape
                                    and x.tobytes() == y.tobytes() for x, y in zip(a, b))


def _expected(stack: Stack, fault: str) -> list[str]:
    fault = _kind(fault)
    if fault == "ecc_correctable":
        return []                              # nothing raised: corrected and counted
    if fault == "out_of_memory":
        names = {stack.runtime.errors.faults["out_of_memory"], stack.driver.errors.faults["out_of_memory"]}
        return sorted(names)
    return [stack.driver.errors.faults.get(fault) or stack.driver.errors.faults["unknown"]]


def _kind(fault: str) -> str:
    """The fault kind a drill fault injects (``ecc_uncontained`` is an uncorrectable ECC error)."""
    return "ecc_uncorrectable" if fault == "ecc_uncontained" else fault


def _scope(stack: Stack, fault: str) -> str:
    """Where ``fault`` lands on the stack's chip: ``partition`` or ``device``."""
    if stack.layout is None or fault in ("out_of_memory", "ecc_correctable"):
        return "partition"                     # memory and corrected errors stay where they are
    return stack.layout.mode.scope(_kind(fault), fault not in PARTITION_FAULTS)


def _recovery(stack: Stack, fault: str) -> str:
    drv = stack.driver
    if _scope(stack, fault) == "device" and stack.layout is not None:
        if len(stack.devices) > 1:
            return f"chip reset: {drv.calls.get('reset', 'reset')} (every partition)"
        return f"device reset: {drv.calls.get('reset', 'reset')}"
    fault = _kind(fault)
    if fault in drv.lost_conditions:
        return f"device reset: {drv.calls.get('reset', 'reset')}"
    if fault in drv.sticky_conditions:
        return f"new context: {stack.runtime.calls.get('device_reset', 'device_reset')}"
    if fault == "out_of_memory":
        return "free, empty cache, retry"
    return "none (corrected)" if fault == "ecc_correctable" else "retry"


def drill_row(fault: str, family: str, front_end: str, spec: str | None = None,
              trace: list | None = None, partition: str | None = None) -> DrillRow:
    """Drill one fault on one family through one front end (see the module docstring);
    with ``partition``, on partition 0 of the chip split that way."""
    stack = compose(make_config(family, spec=spec, partition=partition))
    row = DrillRow(fault, family, front_end)
    if fault == "migration":
        return _migration(stack, row, trace)
    if fault in PARTITION_FAULTS and stack.layout is None:
        raise ValueError(f"drill fault {fault!r} needs a partitioned chip (partition=...)")
    front = FRONTS[front_end](stack)
    clean = front.run()
    neighbour = _Neighbour(stack, 1) if len(stack.devices) > 1 and stack.layout is not None else None
    nb_clean = neighbour.run() if neighbour is not None else []
    baseline = _allocator_state(stack, front_end)
    row.expected = _expected(stack, fault)
    row.recovery = _recovery(stack, fault)
    device = stack.devices[0]
    hog = None
    if fault == "out_of_memory":
        hog = stack.driver.create_context(0)
        free, _ = stack.driver.memory_info(0)
        stack.driver.allocate(hog, free - 64 * 1024)
        if stack.driver.context_rule == "thread":
            stack.driver.pop_current()          # the co-tenant is another process's context
    else:
        op = "copy" if fault == "link_failure" else "kernel"
        device.inject(FaultPlan((FaultSpec(_kind(fault), at=1, op=op,
                                           contained=fault not in PARTITION_FAULTS),)))
    corrected = device.ecc_corrected
    try:
        front.run()
    except Exception as exc:                    # noqa: BLE001 - the drill reports any failure
        err = _fornax_error(exc)
        row.code = err.code.name if err is not None and err.code is not None else type(exc).__name__
        row.detail = str(err if err is not None else exc).splitlines()[0][:200]
        row.detected = row.code in row.expected
    else:
        if fault == "ecc_correctable":
            row.detected = device.ecc_corrected == corrected + 1
            row.code = None
            row.detail = f"{device.ecc_corrected - corrected} error(s) corrected and counted"
        else:
            row.detail = "the fault raised no error"
    device.inject(None)
    scope = _scope(stack, fault)
    during = _neighbour_during(stack, neighbour, nb_clean) if neighbour is not None else ("", 0)
    kind = _kind(fault)
    try:
        if hog is not None:
            stack.driver.destroy_context(hog)
            stack.runtime.empty_cache()
        elif (scope == "device" and stack.layout is not None) or kind in stack.driver.lost_conditions \
                or kind in stack.driver.sticky_conditions:
            front.reset(row.detail or fault)
        again = front.run()
        after = _allocator_state(stack, front_end)
        nb_after = neighbour.run() if neighbour is not None else []
    except Exception as exc:                    # noqa: BLE001
        err = _fornax_error(exc)
        row.detail += f"; recovery failed: {str(err or exc).splitlines()[0][:200]}"
        return row
    if stack.layout is not None:
        row.partition = _isolation(stack, scope, during, _same(nb_clean, nb_after), neighbour is not None)
    row.identical = _same(clean, again)
    row.recovered = after == baseline
    if not row.recovered:
        row.detail += (f"; allocator after recovery (allocated, reserved, mapped) {after} "
                       f"!= baseline {baseline}")
    if trace is not None:
        trace.append((f"{fault}-{family}-{front_end}", stack))
    return row


def _neighbour_during(stack: Stack, neighbour: _Neighbour, clean: list[np.ndarray]) -> tuple[str, int]:
    """What the neighbour partition saw while partition 0 was faulted: ``running`` (its
    work ran with identical results), ``down`` (it failed, the chip's fault took it down),
    or ``wrong`` (it ran with other results); and how many other partitions were lost."""
    lost = sum(stack.driver.is_lost(i) for i in range(1, len(stack.devices)))
    try:
        out = neighbour.run()
    except FornaxError:
        return "down", lost
    return ("running" if _same(out, clean) else "wrong"), lost


def _isolation(stack: Stack, scope: str, during: tuple[str, int], same_after: bool,
               has_neighbour: bool) -> dict:
    """The partition part of a row: where the fault landed and whether the neighbour saw
    what the mode says (running and no other partition lost, or down with every other
    partition), and ran again with identical results after recovery."""
    assert stack.layout is not None
    others = len(stack.devices) - 1
    state, lost = during
    if not has_neighbour:
        isolated, text = True, "no other partition"
    else:
        want = ("running", 0) if scope == "partition" else ("down", others)
        isolated = (state, lost) == want and same_after
        text = f"{state} ({lost} of {others} other partition(s) lost)"
    return {"layout": stack.layout.text, "mode": stack.layout.mode.name, "scope": scope,
            "neighbour": text, "neighbour_after": "identical" if same_after else "different",
            "isolated": isolated}


def _migration(stack: Stack, row: DrillRow, trace: list | None) -> DrillRow:
    """A kernel over managed memory: pages migrate (or are read remotely) and it completes."""
    drv = stack.driver
    g = _GraphFront(stack)
    plan = stack.compiler.compile(g.graph, stack.target)
    clean = g.run()
    ctx = stack.runtime.context(0)
    names = [n for n in ("in0", "in1", "in2", "out0")]
    ptrs = {n: drv.allocate(ctx, N * 4, "managed") for n in names}
    for n, arr in zip(names, g.feeds.values()):
        drv.host_write(ctx, ptrs[n], arr)
    step = plan.kernel_steps()[0]
    args = {p: ptrs[p] for p in step.args}
    assert plan.binary is not None, "the drill graph compiles to a kernel"
    module = drv.load_module(ctx, plan.binary)
    q = drv.create_queue(ctx)
    policy = drv.managed_policy(stack.devices[0])
    row.expected = [f"managed memory: {policy}"]
    row.recovery = "none (not a fault)"
    before = dict(drv.counts)
    t_before = drv.managed_migration_s
    try:
        q.launch(module, step.entry, step.grid, args)
        q.synchronize()
    except FornaxError as exc:
        row.code = exc.code.name if exc.code else exc.kind
        row.detail = f"the managed-memory kernel failed: {exc.message}"
        return row
    out = np.frombuffer(drv.host_read(ctx, ptrs["out0"], N * 4), np.float32).copy()
    moved = drv.counts["managed_migrations_h2d"] - before["managed_migrations_h2d"]
    remote = drv.counts["managed_remote_bytes"] - before["managed_remote_bytes"]
    seconds = drv.managed_migration_s - t_before
    row.code = None
    row.detected = moved > 0 or remote > 0
    row.detail = (f"{policy}: {moved} page migration(s) to the device taking {seconds * 1e6:.2f} µs "
                  f"of simulated time, {remote} bytes read over the host link; no watchdog")
    row.identical = _same([out], clean)
    for p in ptrs.values():
        drv.free(ctx, p)
    drv.unload_module(module)
    drv.destroy_queue(q)
    row.recovered = _allocator_state(stack)[2] == 0
    if trace is not None:
        trace.append((f"{row.fault}-{row.family}-{row.front_end}", stack))
    return row


def drill(faults=FAULTS, families=None, front_ends=FRONT_ENDS, spec: str | None = None,
          trace: list | None = None, progress=None, partition: str | None = None) -> dict:
    """Every (fault, family, front end) row; a ``fornax.drill/1`` document (with
    ``partition``: every row on partition 0 of the chip split that way)."""
    families = list(families or runnable_vendors())
    where = {"partition": partition} if partition is not None else {}
    rows = []
    for fault in faults:
        for family in families:
            for fe in front_ends:
                if fault == "migration" and fe != "graph":
                    continue
                row = drill_row(fault, family, fe, spec=spec, trace=trace, **where)
                rows.append(row.to_dict())
                if progress is not None:
                    progress(row)
    doc = {"schema": SCHEMA, "faults": list(faults), "families": families,
           "front_ends": list(front_ends), "rows": rows,
           "passed": sum(r["ok"] for r in rows), "failed": sum(not r["ok"] for r in rows)}
    if partition is not None:
        doc["partition"] = partition
    return doc
