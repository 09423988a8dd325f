"""The driver seam's contract, clause by clause."""

from __future__ import annotations

import numpy as np

from ..layers.binary import KernelBinary
from ..layers.compiler import KernelStep, Target
from ..layers.errors import BinaryError, DeviceLostError, MemoryFaultError, OutOfMemoryError
from ..sim import isa
from .base import ContractFailure, Subject, add_relu_graph, clause, expect_error, require, rng_arrays

SEAM = "driver"
N = 300


def _kernel(subject: Subject, ctx):
    plan = subject.binaries(add_relu_graph(N))[0]
    step = next(s for s in plan.steps if isinstance(s, KernelStep))
    module = subject.driver().load_module(ctx, plan.binary)
    return plan, step, module


def _run_add_relu(subject: Subject, ctx, queue=None, a_ptr=None):
    d = subject.driver()
    plan, step, module = _kernel(subject, ctx)
    a, b = rng_arrays(N)
    q = queue or d.create_queue(ctx)
    ptrs = {name: d.allocate(ctx, N * 4) for name in ("in0", "in1", "out0")}
    q.copy_h2d(ptrs["in0"], a)
    q.copy_h2d(ptrs["in1"], b)
    if a_ptr is not None:
        ptrs["in0"] = a_ptr
    q.launch(module, step.entry, step.grid, ptrs)
    out = np.empty(N, np.float32)
    q.copy_d2h(out, ptrs["out0"])
    return q, out, np.maximum(a.astype(np.float64) + b, 0)


@clause(SEAM, "D01", "enumerates the simulated devices and describes them")
def discovery(s: Subject) -> None:
    d = s.driver()
    require(d.device_count() == len(s.devices), f"device_count() is {d.device_count()}, "
            f"{len(s.devices)} devices were given")
    for i in range(d.device_count()):
        p = d.properties(i)
        require(isinstance(p.target, str) and p.target, f"device {i} has no target name")
        require(p.compute_units == s.spec.compute_units,
                f"device {i} reports {p.compute_units} compute units, the spec has {s.spec.compute_units}")
        require(p.memory_bytes == s.spec.hbm_bytes, f"device {i} reports {p.memory_bytes} bytes of memory")
        require(isinstance(p.native, dict) and p.native, f"device {i} has no properties in its own vocabulary")


@clause(SEAM, "D02", "rejects a device ordinal out of range with a vendor code")
def bad_ordinal(s: Subject) -> None:
    d = s.driver()
    expect_error(lambda: d.properties(d.device_count()), "properties(device_count())")
    expect_error(lambda: d.create_context(-1), "create_context(-1)")


@clause(SEAM, "D03", "names the binary formats it loads")
def formats(s: Subject) -> None:
    fmts = s.driver().loadable_formats(0)
    require(len(fmts) > 0 and all(isinstance(f, str) and f for f in fmts),
            f"loadable_formats(0) is {fmts!r}")


@clause(SEAM, "D04", "creates independent contexts and refuses a destroyed one")
def contexts(s: Subject) -> None:
    d = s.driver()
    a, b = d.create_context(0), d.create_context(0)
    require(a is not b, "two create_context calls returned the same context")
    d.destroy_context(a)
    expect_error(lambda: d.allocate(a, 64), "allocate in a destroyed context")
    expect_error(lambda: d.destroy_context(a), "destroying a context twice")
    d.allocate(b, 64)


@clause(SEAM, "D05", "allocates distinct, aligned device memory and frees it once")
def allocation(s: Subject) -> None:
    d = s.driver()
    ctx = d.create_context(0)
    sizes = (1, 4096, 100_000)
    ptrs = [d.allocate(ctx, n) for n in sizes]
    require(all(isinstance(p, int) for p in ptrs), f"allocate returned {ptrs!r}, not integer addresses")
    require(all(p % 256 == 0 for p in ptrs), f"allocations are not 256-byte aligned: {[hex(p) for p in ptrs]}")
    spans = sorted(zip(ptrs, sizes))
    require(all(p1 + n1 <= p2 for (p1, n1), (p2, _) in zip(spans, spans[1:])), "allocations overlap")
    d.free(ctx, ptrs[0])
    expect_error(lambda: d.free(ctx, ptrs[0]), "double free")
    expect_error(lambda: d.free(ctx, ptrs[1] + 8), "free of an address inside an allocation")
    for bad in (0, -5):
        expect_error(lambda: d.allocate(ctx, bad), f"allocate({bad})")


@clause(SEAM, "D06", "reports out-of-memory with the vendor's code and keeps working")
def out_of_memory(s: Subject) -> None:
    d = s.driver()
    ctx = d.create_context(0)
    err = expect_error(lambda: d.allocate(ctx, 2 * s.spec.hbm_bytes), "allocating twice the capacity",
                       (OutOfMemoryError,))
    require("bytes" in str(err), f"the out-of-memory message does not give sizes: {err}")
    d.allocate(ctx, 4096)


@clause(SEAM, "D07", "copies host->device->device->host through a queue")
def copies(s: Subject) -> None:
    d = s.driver()
    ctx = d.create_context(0)
    q = d.create_queue(ctx)
    data = np.arange(1000, dtype=np.int32)
    x, y = d.allocate(ctx, data.nbytes), d.allocate(ctx, data.nbytes)
    q.copy_h2d(x, data)
    q.copy_d2d(y, x, data.nbytes)
    out = np.zeros_like(data)
    q.copy_d2h(out, y)
    q.synchronize()
    require(np.array_equal(out, data), "the bytes that came back differ from the bytes sent")


@clause(SEAM, "D08", "refuses copies outside an allocation with a vendor code")
def copy_bounds(s: Subject) -> None:
    d = s.driver()
    ctx = d.create_context(0)
    q = d.create_queue(ctx)
    x = d.allocate(ctx, 64)
    expect_error(lambda: q.copy_h2d(x, np.zeros(1024, np.float32)), "copying 4 KiB into 64 bytes")
    expect_error(lambda: q.copy_d2h(np.zeros(1024, np.float32), x), "copying 4 KiB out of 64 bytes")


@clause(SEAM, "D09", "loads its family's compiled module and runs it correctly")
def load_and_launch(s: Subject) -> None:
    d = s.driver()
    for plan in s.binaries(add_relu_graph(N)):
        ctx = d.create_context(0)
        step = next(st for st in plan.steps if isinstance(st, KernelStep))
        module = d.load_module(ctx, plan.binary)
        q = d.create_queue(ctx)
        a, b = rng_arrays(N, seed=1)
        ptrs = {n: d.allocate(ctx, N * 4) for n in ("in0", "in1", "out0")}
        q.copy_h2d(ptrs["in0"], a)
        q.copy_h2d(ptrs["in1"], b)
        q.launch(module, step.entry, step.grid, ptrs)
        out = np.empty(N, np.float32)
        q.copy_d2h(out, ptrs["out0"])
        q.synchronize()
        ref = np.maximum(a.astype(np.float64) + b, 0)
        require(np.allclose(out, ref, rtol=1e-6, atol=1e-6),
                f"{plan.binary.format}: kernel result differs from relu(a + b) "
                f"(max error {np.abs(out - ref).max():.3g})")


@clause(SEAM, "D10", "rejects a corrupted image with a vendor code")
def corrupt_image(s: Subject) -> None:
    d = s.driver()
    ctx = d.create_context(0)
    for plan in s.binaries(add_relu_graph(N)):
        b = plan.binary
        flipped = bytearray(b.data)
        mid = len(flipped) // 2
        flipped[mid] ^= 0x5A
        data = bytes(flipped[: len(flipped) - 7])
        bad = KernelBinary(b.format, b.target, b.entry_points, data, b.producer)
        expect_error(lambda: d.load_module(ctx, bad), f"loading a corrupted {b.format} image", (BinaryError,))


@clause(SEAM, "D11", "rejects a binary format it does not load, naming it")
def foreign_format(s: Subject) -> None:
    d = s.driver()
    ctx = d.create_context(0)
    bad = KernelBinary("nonexistent-format", "nowhere", ("k",), b"\0" * 64)
    err = expect_error(lambda: d.load_module(ctx, bad), "loading a nonexistent-format image")
    require("nonexistent-format" in str(err), f"the error does not name the format: {err}")


@clause(SEAM, "D12", "rejects an unknown kernel name and bad launch shapes")
def launch_errors(s: Subject) -> None:
    d = s.driver()
    ctx = d.create_context(0)
    plan, step, module = _kernel(s, ctx)
    q = d.create_queue(ctx)
    ptrs = {n: d.allocate(ctx, N * 4) for n in ("in0", "in1", "out0")}
    expect_error(lambda: q.launch(module, "no_such_kernel", step.grid, ptrs), "launching an unknown kernel")
    expect_error(lambda: q.launch(module, step.entry, (0, 1, 1), ptrs), "launching an empty grid")
    expect_error(lambda: q.launch(module, step.entry, step.grid, {"in0": ptrs["in0"]}),
                 "launching with missing arguments")


@clause(SEAM, "D13", "orders work across queues with record/wait")
def cross_queue_order(s: Subject) -> None:
    d = s.driver()
    ctx = d.create_context(0)
    q1, q2 = d.create_queue(ctx), d.create_queue(ctx)
    plan, step, module = _kernel(s, ctx)
    a, b = rng_arrays(N, seed=2)
    ptrs = {n: d.allocate(ctx, N * 4) for n in ("in0", "in1", "out0")}
    q1.copy_h2d(ptrs["in0"], a)
    q1.copy_h2d(ptrs["in1"], b)
    q1.launch(module, step.entry, step.grid, ptrs)
    q2.wait(q1.record())
    out = np.empty(N, np.float32)
    q2.copy_d2h(out, ptrs["out0"])
    q2.synchronize()
    require(np.allclose(out, np.maximum(a.astype(np.float64) + b, 0), rtol=1e-6, atol=1e-6),
            "a copy ordered after another queue's kernel did not see its result")


@clause(SEAM, "D14", "an illegal address faults with the vendor code and poisons the context")
def illegal_address(s: Subject) -> None:
    d = s.driver()
    ctx = d.create_context(0)
    gone = d.allocate(ctx, N * 4)
    d.free(ctx, gone)
    q, _, _ = _run_add_relu(s, ctx, a_ptr=gone)
    err = expect_error(q.synchronize, "synchronising after a kernel read freed memory",
                       (MemoryFaultError, DeviceLostError))
    again = expect_error(lambda: d.allocate(ctx, 64), "using the context after the fault")
    require(again.code == err.code, f"after {err.code} the context reported {again.code}")
    fresh = d.create_context(1)
    q2, out, ref = _run_add_relu(s, fresh)
    q2.synchronize()
    require(np.allclose(out, ref, rtol=1e-6, atol=1e-6), "a new context on another device does not work")


@clause(SEAM, "D15", "keeps contexts apart: another context's pointer faults")
def isolation(s: Subject) -> None:
    d = s.driver()
    owner, other = d.create_context(0), d.create_context(0)
    secret = np.full(N, 7.0, np.float32)
    p = d.allocate(owner, N * 4)
    qo = d.create_queue(owner)
    qo.copy_h2d(p, secret)
    qo.synchronize()
    q, _, _ = _run_add_relu(s, other, a_ptr=p)
    expect_error(q.synchronize, "a kernel in one context reading another context's memory",
                 (MemoryFaultError, DeviceLostError))
    # read the owner's bytes from the simulated HBM itself: the family may have lost the device
    mapping = s.devices[0].memory.owner_of(p)
    if mapping is None:
        raise ContractFailure("the owner's allocation is no longer mapped in device memory")
    back = np.frombuffer(mapping.buffer[p - mapping.va: p - mapping.va + N * 4].tobytes(), np.float32)
    require(np.array_equal(back, secret), "the owner's memory changed")


@clause(SEAM, "D16", "reports what it did")
def report(s: Subject) -> None:
    d = s.driver()
    ctx = d.create_context(0)
    q, _, _ = _run_add_relu(s, ctx)
    q.synchronize()
    rep = d.report()
    require(isinstance(rep, dict) and rep.get("vendor") == s.vendor.name,
            f"report() must be a dict naming the vendor, got {str(rep)[:80]}")
    if not isinstance(rep.get("launches", 1), int):
        raise ContractFailure("report()['launches'] is not a count")


@clause(SEAM, "D17", "managed memory is usable from the host and from device kernels")
def managed_memory(s: Subject) -> None:
    d = s.driver()
    ctx = d.create_context(0)
    plan, step, module = _kernel(s, ctx)
    a, b = rng_arrays(N, seed=3)
    ptrs = {name: d.allocate(ctx, N * 4, "managed") for name in ("in0", "in1", "out0")}
    d.host_write(ctx, ptrs["in0"], a)
    d.host_write(ctx, ptrs["in1"], b)
    q = d.create_queue(ctx)
    q.launch(module, step.entry, step.grid, ptrs)
    q.synchronize()
    out = np.frombuffer(d.host_read(ctx, ptrs["out0"], N * 4), np.float32)
    require(np.allclose(out, np.maximum(a.astype(np.float64) + b, 0), rtol=1e-6, atol=1e-6),
            "a kernel over managed memory, written and read by the host, gave a wrong result")
    dev = d.allocate(ctx, 64)
    expect_error(lambda: d.host_read(ctx, dev, 64), "the host reading plain device memory")


def _limit_program(name: str, **meta) -> isa.Program:
    return isa.verify(isa.Program(name, (isa.Param("dst", "ptr", "float32"),), (
        isa.Arange("%i", 32), isa.Const("%one", 1.0, "float32"),
        isa.Broadcast("%v", "%one", (32,)), isa.Store("dst", "%i", "%v"),
    ), meta))


@clause(SEAM, "D18", "enforces launch limits (work-group size, registers, shared memory) with a vendor code")
def launch_limits(s: Subject) -> None:
    d = s.driver()
    ctx = d.create_context(0)
    spec = s.spec
    programs = [_limit_program("fits", group_size=32, registers=32, shared_memory=1024),
                _limit_program("wide", group_size=2 * spec.max_group_size),
                _limit_program("hungry", group_size=spec.max_group_size,
                               registers=2 * spec.registers_per_unit // spec.max_group_size),
                _limit_program("big_smem", group_size=32, shared_memory=spec.shared_memory_per_unit + 1)]
    props = d.properties(0)
    compiler = s.vendor.compiler()
    fmt = next((f for f in compiler.output_formats() if f in d.loadable_formats(0)), None)
    if fmt is None:
        raise ContractFailure("the family's compiler emits no format its driver loads")
    module = d.load_module(ctx, compiler.emit(programs, Target(props.target, fmt, props.compute_units)))
    q = d.create_queue(ctx)
    dst = d.allocate(ctx, 128)
    q.launch(module, "fits", (1, 1, 1), {"dst": dst})
    q.synchronize()
    for name, what in (("wide", "a work-group larger than the device allows"),
                       ("hungry", "more registers than a compute unit has"),
                       ("big_smem", "more shared memory than a compute unit has")):
        expect_error(lambda: q.launch(module, name, (1, 1, 1), {"dst": dst}), f"launching with {what}")
    q.launch(module, "fits", (1, 1, 1), {"dst": dst})     # a refused launch leaves the queue usable
    q.synchronize()
