"""The deterministic cross-instance reduction (store_reduce) against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.execute import execute
from fornax.sim.faults import InvalidProgram
from fornax.sim.spec import load_spec

BLOCK = 64


def _program(fn: str, dtype: str = "float32") -> isa.Program:
    """Each instance reduces its BLOCK-slice of x into out[bucket], bucket = pid % 3."""
    body = (
        isa.ProgramId("%p"), isa.Const("%B", BLOCK, "int64"), isa.Binary("%base", "mul", "%p", "%B"),
        isa.Arange("%r", BLOCK), isa.Binary("%o", "add", "%base", "%r"),
        isa.ScalarArg("%n", "n"), isa.Binary("%m", "lt", "%o", "%n"),
        isa.Load("%v", "x", "%o", "%m"),
        isa.Const("%three", 3, "int64"), isa.Binary("%bucket", "mod", "%p", "%three"),
        isa.StoreReduce("out", "%bucket", "%v", fn, "%m"),
    )
    params = (isa.Param("x", "ptr", dtype), isa.Param("out", "ptr", dtype), isa.Param("n", "scalar", "int64"))
    return isa.verify(isa.Program(f"reduce_{fn}", params, body))


def _run(program, x: np.ndarray, init: np.ndarray):
    dev = Device(load_spec("tiny"))
    space = dev.memory.create_space()
    xm, om = space.map(x.nbytes), space.map(init.nbytes)
    space.write(xm.va, x)
    space.write(om.va, init)
    grid = (-(-x.size // BLOCK), 1, 1)
    counters = execute(program, grid, {"x": xm.va, "out": om.va, "n": x.size}, space)
    return np.frombuffer(space.read(om.va, init.nbytes), init.dtype).copy(), counters


@pytest.mark.parametrize("fn, ref", [("sum", np.add), ("max", np.maximum), ("min", np.minimum)])
def test_store_reduce_matches_numpy(fn, ref):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000).astype(np.float32)
    init = np.array([1.5, -2.0, 0.25], np.float32)
    got, counters = _run(_program(fn), x, init)
    buckets = (np.arange(x.size) // BLOCK) % 3
    expect = init.astype(np.float64)
    for b in range(3):
        expect[b] = ref.reduce(np.concatenate([[init[b]], x[buckets == b].astype(np.float64)]))
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)
    assert counters.write_ranges["out"][1] - counters.write_ranges["out"][0] == 3 * 4


def test_store_reduce_is_deterministic_and_sequential():
    """The float32 sum is exactly the sequential sum in instance order, every time."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(5000) * 1e3).astype(np.float32)
    init = np.zeros(3, np.float32)
    runs = [_run(_program("sum"), x, init)[0] for _ in range(3)]
    assert all(np.array_equal(runs[0], r) for r in runs)
    buckets = (np.arange(x.size) // BLOCK) % 3
    for b in range(3):
        acc = np.float32(0)
        for v in x[buckets == b]:
            acc = np.float32(acc + v)
        assert runs[0][b] == acc


def test_store_reduce_round_trips_and_verifies():
    p = _program("max")
    assert isa.assemble(isa.disassemble(p)) == p
    assert isa.decode(isa.encode(p)) == p
    bad = isa.Program("k", p.params, p.body[:-1] + (isa.StoreReduce("out", "%bucket", "%v", "prod", "%m"),))
    with pytest.raises(InvalidProgram, match="unknown reduction 'prod'"):
        isa.verify(bad)
