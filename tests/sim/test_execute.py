"""The executor against float64 numpy references."""

import math

import ml_dtypes
import numpy as np
import pytest

from fornax.layers import codegen
from fornax.layers.graph import DType
from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.execute import execute
from fornax.sim.faults import ExecutionError, PageFault
from fornax.sim.isa import (Arange, Binary, Const, Convert, Load, Param, Program, ProgramId, Reduce,
                            Reshape, ScalarArg, Store, Unary)
from fornax.sim.spec import load_spec


@pytest.fixture
def dev():
    return Device(load_spec("tiny"))


@pytest.fixture
def space(dev):
    return dev.memory.create_space()


def put(space, arr):
    arr = np.ascontiguousarray(arr)
    m = space.map(max(1, arr.nbytes))
    space.write(m.va, arr.tobytes())
    return m.va


def alloc(space, shape, dtype):
    n = math.prod(shape) * np.dtype(dtype).itemsize
    return space.map(max(1, n)).va


def get(space, va, shape, dtype):
    dtype = np.dtype(dtype)
    return np.frombuffer(space.read(va, math.prod(shape) * dtype.itemsize), dtype=dtype).reshape(shape)


def elementwise_program(block):
    """out[i] = x[i] * x[i] + relu(y[i]) for i < n."""
    return isa.verify(Program("ew", (Param("x", "ptr", "float32"), Param("y", "ptr", "float32"),
                                     Param("out", "ptr", "float32"), Param("n", "scalar", "int64")), (
        ProgramId("%pid"),
        Const("%bs", block, "int64"),
        Binary("%base", "mul", "%pid", "%bs"),
        Arange("%lane", block),
        Binary("%i", "add", "%base", "%lane"),
        ScalarArg("%n", "n"),
        Binary("%m", "lt", "%i", "%n"),
        Load("%x", "x", "%i", "%m"),
        Load("%y", "y", "%i", "%m"),
        Binary("%xx", "mul", "%x", "%x"),
        Unary("%ry", "relu", "%y"),
        Binary("%r", "add", "%xx", "%ry"),
        Store("out", "%i", "%r", "%m"),
    )))


def test_elementwise_with_mask_over_ragged_size(dev, space):
    n, block = 1000, 128                      # 1000 is not a multiple of 128
    rng = np.random.default_rng(1)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    px, py = put(space, x), put(space, y)
    # the output has a sentinel tail past n that must stay untouched
    pout = put(space, np.full(n + 24, 7.0, np.float32))
    grid = (math.ceil(n / block), 1, 1)
    counters, cost = dev.run_kernel(space, elementwise_program(block), grid,
                                    {"x": px, "y": py, "out": pout, "n": n})
    out = get(space, pout, (n + 24,), np.float32)
    ref = x.astype(np.float64) ** 2 + np.maximum(y.astype(np.float64), 0)
    np.testing.assert_allclose(out[:n], ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out[n:], 7.0)
    assert counters.instances == 8
    assert counters.bytes_read == 2 * 4 * n      # only active lanes are counted
    assert counters.bytes_written == 4 * n
    assert cost.duration_s > 0


def masked_other_program():
    """o[i] = x[i] for i < 5, else -3 (a masked load's other value)."""
    return isa.verify(Program("k", (Param("x", "ptr", "float32"), Param("o", "ptr", "float32")), (
        Arange("%i", 8), Const("%five", 5, "int64"), Binary("%m", "lt", "%i", "%five"),
        Load("%x", "x", "%i", "%m", -3.0), Store("o", "%i", "%x"))))


def test_masked_load_other_value(dev, space):
    p = masked_other_program()
    px = put(space, np.arange(5, dtype=np.float32))
    po = alloc(space, (8,), np.float32)
    execute(p, (1, 1, 1), {"x": px, "o": po}, space)
    np.testing.assert_array_equal(get(space, po, (8,), np.float32), [0, 1, 2, 3, 4, -3, -3, -3])


def rowsum_program(cols, width):
    """s[row] = sum of row ``row`` of x (``cols`` wide, in a ``width``-lane tile); mx[row] its max."""
    return isa.verify(Program("rowsum", (Param("x", "ptr", "float32"), Param("s", "ptr", "float32"),
                                      Param("mx", "ptr", "float32")), (
        ProgramId("%row"),
        Arange("%col", width),
        Const("%cols", cols, "int64"),
        Binary("%m", "lt", "%col", "%cols"),
        Binary("%rb", "mul", "%row", "%cols"),
        Binary("%off", "add", "%rb", "%col"),
        Load("%x", "x", "%off", "%m", 0.0),
        Reduce("%s", "sum", "%x", -1),
        Load("%xm", "x", "%off", "%m", float("-inf")),
        Reduce("%mx", "max", "%xm", 0),
        Store("s", "%row", "%s"),
        Store("mx", "%row", "%mx"),
    )))


def test_row_reduction(dev, space):
    rows, cols = 13, 40
    width = 64
    rng = np.random.default_rng(2)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    p = rowsum_program(cols, width)
    px = put(space, x)
    ps, pm = alloc(space, (rows,), np.float32), alloc(space, (rows,), np.float32)
    c = execute(p, (rows, 1, 1), {"x": px, "s": ps, "mx": pm}, space)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(get(space, ps, (rows,), np.float32), x64.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(get(space, pm, (rows,), np.float32), x.max(1))
    assert c.bytes_read == 2 * rows * cols * 4
    assert c.bytes_written == 2 * rows * 4


def grid_ids_program():
    """o[z, y, x] = 100 z + 10 y + x over a (3, 4, 2) grid."""
    return isa.verify(Program("ids", (Param("o", "ptr", "int64"),), (
        ProgramId("%x", 0), ProgramId("%y", 1), ProgramId("%z", 2),
        Const("%c100", 100, "int64"), Const("%c10", 10, "int64"),
        Const("%sx", 1, "int64"), Const("%sy", 3, "int64"), Const("%sz", 12, "int64"),
        Binary("%a", "mul", "%z", "%c100"), Binary("%b", "mul", "%y", "%c10"),
        Binary("%v0", "add", "%a", "%b"), Binary("%v", "add", "%v0", "%x"),
        Binary("%o0", "mul", "%z", "%sz"), Binary("%o1", "mul", "%y", "%sy"),
        Binary("%o2", "add", "%o0", "%o1"), Binary("%off", "add", "%o2", "%x"),
        Store("o", "%off", "%v"))))


def test_two_dimensional_grid_program_ids(dev, space):
    p = grid_ids_program()
    po = alloc(space, (24,), np.int64)
    execute(p, (3, 4, 2), {"o": po}, space)
    z, y, x = np.meshgrid(range(2), range(4), range(3), indexing="ij")
    np.testing.assert_array_equal(get(space, po, (24,), np.int64), (100 * z + 10 * y + x).ravel())


# ---- GEMM ----------------------------------------------------------------------------
DTYPES = {"float32": (DType.FLOAT32, np.float32), "float16": (DType.FLOAT16, np.float16),
          "bfloat16": (DType.BFLOAT16, ml_dtypes.bfloat16)}


def _check_gemm(out, a, b, npdt):
    """|out - A@B| within fp32-accumulation error plus one rounding to the output dtype."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64 @ b64
    k = a.shape[-1]
    eps_out = float(ml_dtypes.finfo(npdt).eps)
    eps32 = float(np.finfo(np.float32).eps)
    bound = eps_out * np.abs(ref) + 2 * k * eps32 * (np.abs(a64) @ np.abs(b64)) + 1e-30
    err = np.abs(out.astype(np.float64) - ref)
    assert np.all(err <= bound), f"max excess {np.max(err - bound)}"


def _run_gemm(dev, space, dtname, m, n, k, batch=1, b_batched=False, dynamic=False,
              tile=(32, 32, 16)):
    dt, npdt = DTYPES[dtname]
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    a_shape = (batch, m, k)
    b_shape = (batch, k, n) if b_batched else (k, n)
    a = rng.standard_normal(a_shape).astype(npdt)
    b = rng.standard_normal(b_shape).astype(npdt)
    pa, pb = put(space, a), put(space, b)
    pc = alloc(space, (batch, m, n), npdt)
    args = {"a": pa, "b": pb, "c": pc}
    if dynamic:
        prog, grid = codegen.gemm_kernel("gemm_dyn", dt, "m", "n", "k", batch, b_batched, tile, 128)
        assert grid is None
        assert [p.name for p in prog.params if p.kind == "scalar"] == ["m", "n", "k"]
        grid = (math.ceil(n / tile[1]), math.ceil(m / tile[0]), batch)
        args.update(m=m, n=n, k=k)
    else:
        prog, grid = codegen.gemm_kernel("gemm", dt, m, n, k, batch, b_batched, tile, 128)
    counters, cost = dev.run_kernel(space, prog, grid, args)
    out = get(space, pc, (batch, m, n), npdt)
    _check_gemm(out, a, b if b_batched else np.broadcast_to(b, (batch, k, n)), npdt)
    return counters, cost


@pytest.mark.parametrize("dtname", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("shape", [(37, 53, 29), (64, 32, 48), (1, 1, 1), (5, 70, 100)])
def test_gemm_matches_float64(dev, space, dtname, dynamic, shape):
    _run_gemm(dev, space, dtname, *shape, dynamic=dynamic)


@pytest.mark.parametrize("b_batched", [True, False])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_batched_gemm(dev, space, b_batched, dynamic):
    _run_gemm(dev, space, "float32", 19, 23, 33, batch=3, b_batched=b_batched, dynamic=dynamic)
    _run_gemm(dev, space, "bfloat16", 19, 23, 33, batch=2, b_batched=b_batched, dynamic=dynamic)


def test_dynamic_gemm_kernel_is_reusable_across_sizes(dev, space):
    prog, _ = codegen.gemm_kernel("g", DType.FLOAT32, "m", "n", "k", 1, False, (16, 16, 16), 64)
    rng = np.random.default_rng(5)
    for m, n, k in [(3, 4, 5), (17, 33, 40), (16, 16, 16)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        pc = alloc(space, (m, n), np.float32)
        execute(prog, (math.ceil(n / 16), math.ceil(m / 16), 1),
                {"a": put(space, a), "b": put(space, b), "c": pc, "m": m, "n": n, "k": k}, space)
        _check_gemm(get(space, pc, (m, n), np.float32), a, b, np.float32)


def test_gemm_counts_flops_and_bytes(dev, space):
    m = n = k = 64
    counters, cost = _run_gemm(dev, space, "float16", m, n, k, tile=(32, 32, 32))
    assert counters.matrix_flops == {"float16": 2.0 * m * n * k}
    assert counters.instances == 4
    # each of 4 instances reads a 32x64 panel of A and a 64x32 panel of B
    assert counters.bytes_read == 4 * (32 * 64 + 64 * 32) * 2
    assert counters.bytes_written == m * n * 2
    assert cost.compute_s > 0 and cost.memory_s > 0


def copy_program(name, n):
    """o[i] = x[i] for i < n (one instance)."""
    return isa.verify(Program(name, (Param("x", "ptr", "float32"), Param("o", "ptr", "float32")), (
        Arange("%i", n), Load("%v", "x", "%i"), Store("o", "%i", "%v"))))


def fill_program():
    """o[i] = 1 for i < 256 (one instance)."""
    return isa.verify(Program("oob_store", (Param("o", "ptr", "float32"),), (
        Arange("%i", 256), Const("%one", 1.0, "float32"), Store("o", "%i", "%one"))))


def test_out_of_bounds_load_page_faults(dev, space):
    p = copy_program("oob", 256)
    m = space.map(100 * 4, label="small")          # 100 floats, kernel reads 256
    po = alloc(space, (256,), np.float32)
    with pytest.raises(PageFault) as info:
        execute(p, (1, 1, 1), {"x": m.va, "o": po}, space)
    assert info.value.address == m.va + 400
    assert f"{m.va + 400:#x}" in str(info.value)
    # a store out of bounds faults as well
    q = fill_program()
    with pytest.raises(PageFault):
        execute(q, (1, 1, 1), {"o": m.va}, space)


def test_unmapped_pointer_faults(dev, space):
    p = copy_program("k", 4)
    po = alloc(space, (4,), np.float32)
    with pytest.raises(PageFault):
        execute(p, (1, 1, 1), {"x": 0x1000, "o": po}, space)


def mixed_dtypes_program():
    """Adds a float16 constant to a float32 tile: an execution error."""
    return isa.verify(Program("k", (Param("x", "ptr", "float32"),), (
        Arange("%i", 4), Const("%h", 1.0, "float16"), Load("%v", "x", "%i"),
        Binary("%bad", "add", "%v", "%h"))))


def bad_reshape_program():
    """Reshapes a 6-lane tile to 4 x 2: an execution error."""
    return isa.verify(Program("r", (), (Arange("%i", 6), Reshape("%j", "%i", (4, 2)))))


def test_execution_errors(dev, space):
    p = mixed_dtypes_program()
    px = put(space, np.zeros(4, np.float32))
    with pytest.raises(ExecutionError, match="dtypes differ"):
        execute(p, (1, 1, 1), {"x": px}, space)
    with pytest.raises(ExecutionError, match="missing argument"):
        execute(p, (1, 1, 1), {}, space)
    q = bad_reshape_program()
    with pytest.raises(ExecutionError, match="reshape"):
        execute(q, (1, 1, 1), {}, space)


def test_vector_flops_counted_per_instance(dev, space):
    n, block = 1000, 128
    px = put(space, np.ones(n, np.float32))
    py = put(space, np.ones(n, np.float32))
    po = alloc(space, (n,), np.float32)
    c = execute(elementwise_program(block), (8, 1, 1), {"x": px, "y": py, "out": po, "n": n}, space)
    # float32 ops per lane: mul, relu, add -> 3 * block * instances (masked lanes compute too)
    assert c.vector_flops["float32"] == 3 * block * 8


def instance_ids_program():
    """o[p] = p as int32, one element per instance."""
    return isa.verify(Program("tiny", (Param("o", "ptr", "int32"),), (
        ProgramId("%p"), Convert("%v", "%p", "int32"), Store("o", "%p", "%v"))))


def test_large_grid_runs_vectorised(dev, space):
    instances = 100_000
    p = instance_ids_program()
    po = alloc(space, (instances,), np.int32)
    c = execute(p, (instances, 1, 1), {"o": po}, space)
    np.testing.assert_array_equal(get(space, po, (instances,), np.int32), np.arange(instances))
    assert c.instances == instances
    assert c.bytes_written == 4 * instances
