"""The static type check of ISA programs (fornax.sim.verify) against the executor.

Every malformed program below is refused by :func:`check_types` with a message naming the
kernel, the instruction and the types that do not fit, and the executor fails on the same
program (so the refusal is never a guess); every valid program passes and runs.
"""

import numpy as np
import pytest

from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.execute import execute
from fornax.sim.isa import (Arange, Binary, Broadcast, Const, Convert, Dot, Load, Loop, Param, Program,
                            ProgramId, Reduce, Reshape, ScalarArg, Store, StoreReduce, Unary, Where)
from fornax.sim.spec import load_spec
from fornax.sim.verify import IllTypedProgram, check_module, check_types

F32 = (Param("src", "ptr", "float32"), Param("dst", "ptr", "float32"))


@pytest.fixture(scope="module")
def space():
    return Device(load_spec("tiny")).memory.create_space()


def run(space, program, grid=(1, 1, 1), scalars=None):
    """Execute ``program`` on two 256-element float32 buffers; returns dst."""
    src = space.map(1024).va
    space.write(src, np.arange(256, dtype=np.float32).tobytes())
    dst = space.map(1024).va
    space.write(dst, np.zeros(256, np.float32).tobytes())
    execute(program, grid, {"src": src, "dst": dst, **(scalars or {})}, space)
    return np.frombuffer(space.read(dst, 1024), np.float32).copy()


def prog(*body, params=F32, name="k"):
    return isa.verify(Program(name, params, tuple(body)))


# == malformed programs: (program, fragments the message must hold) ==============================
MALFORMED = {
    "shapes do not broadcast": (prog(
        Arange("%i", 4), Arange("%j", 8), Binary("%s", "add", "%i", "%j"), Store("dst", "%s", "%s")),
        ["kernel 'k', instruction 2 (binary add)", "%i int64[4]", "%j int64[8]", "do not broadcast"]),
    "operand dtypes differ": (prog(
        Arange("%i", 4), Load("%v", "src", "%i"), Binary("%w", "mul", "%v", "%i"), Store("dst", "%i", "%w")),
        ["instruction 2 (binary mul)", "float32[4] vs int64[4]", "insert a convert"]),
    "reshape cannot hold": (prog(
        Arange("%i", 12), Reshape("%r", "%i", (5, 2)), Store("dst", "%r", "%r")),
        ["instruction 1 (reshape)", "%i int64[12] (12 elements)", "(5, 2) (10 elements)"]),
    "broadcast to a shape that does not fit": (prog(
        Arange("%i", 3), Broadcast("%b", "%i", (4, 2)), Store("dst", "%b", "%b")),
        ["instruction 1 (broadcast)", "int64[3]", "(4, 2)"]),
    "bit operation on floats": (prog(
        Arange("%i", 4), Load("%v", "src", "%i"), Binary("%x", "xor", "%v", "%v"), Store("dst", "%i", "%x")),
        ["instruction 2 (binary xor)", "integer tiles", "float32[4]"]),
    "float offsets": (prog(
        Arange("%i", 4), Load("%v", "src", "%i"), Load("%w", "src", "%v"), Store("dst", "%i", "%w")),
        ["instruction 2 (load)", "offsets %v must be an integer tile", "float32[4]"]),
    "mask does not fit the offsets": (prog(
        Arange("%i", 4), Arange("%j", 3), Binary("%m", "lt", "%j", "%j"), Load("%v", "src", "%i", "%m"),
        Store("dst", "%i", "%v")),
        ["instruction 3 (load)", "offsets %i int64[4]", "mask %m bool[3]"]),
    "stored value does not fit the offsets": (prog(
        Arange("%i", 4), Arange("%j", 8), Load("%v", "src", "%j"), Store("dst", "%i", "%v")),
        ["instruction 3 (store)", "value %v float32[8]", "lanes (4,)"]),
    "reduction over an axis the tile lacks": (prog(
        Arange("%i", 4), Load("%v", "src", "%i"), Reduce("%s", "sum", "%v", 1), Store("dst", "%i", "%s")),
        ["instruction 2 (reduce sum)", "axis 1 out of range", "float32[4]"]),
    "dot of tiles that do not chain": (prog(
        Arange("%i", 8), Reshape("%o", "%i", (2, 4)), Load("%a", "src", "%o"), Load("%b", "src", "%o"),
        Const("%z", 0.0, "float32"), Broadcast("%acc", "%z", (2, 2)), Dot("%d", "%a", "%b", "%acc"),
        Store("dst", "%o", "%d")),
        ["instruction 6 (dot)", "[M,K] x [K,N]", "%a float32[2, 4] x %b float32[2, 4]"]),
    "dot accumulator of the wrong shape": (prog(
        Arange("%i", 8), Reshape("%o", "%i", (2, 4)), Reshape("%p", "%i", (4, 2)), Load("%a", "src", "%o"),
        Load("%b", "src", "%p"), Const("%z", 0.0, "float32"), Broadcast("%acc", "%z", (4, 4)),
        Dot("%d", "%a", "%b", "%acc"), Store("dst", "%o", "%d")),
        ["instruction 7 (dot)", "accumulator %acc float32[4, 4]", "product [2, 2]"]),
    "negating a bool tile": (prog(
        Arange("%i", 4), Binary("%m", "lt", "%i", "%i"), Unary("%n", "neg", "%m"), Store("dst", "%i", "%n")),
        ["instruction 2 (unary neg)", "not defined on bool tiles", "bool[4]"]),
    "loop bound that is not one value": (prog(
        Arange("%i", 4), Loop("%k", 0, "%i", 1, (Store("dst", "%i", "%i"),))),
        ["instruction 1 (loop)", "loop bound %i int64[4] must be one value"]),
    "mismatch inside a loop body": (prog(
        Arange("%i", 4), Arange("%j", 8),
        Loop("%k", 0, 2, 1, (Binary("%s", "add", "%i", "%j"), Store("dst", "%s", "%s")))),
        ["instruction 2.0 (binary add)", "int64[4]", "int64[8]"]),
    "loop-carried register that stops fitting on the second trip": (prog(
        Arange("%i", 4), Const("%acc", 0, "int64"),
        Loop("%k", 0, 3, 1, (Binary("%t", "add", "%acc", "%i"), Reshape("%acc", "%t", (2, 2)))),
        Store("dst", "%i", "%i")),
        ["instruction 2.0 (binary add)", "%acc int64[2, 2]", "%i int64[4]"]),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_program_is_refused_naming_the_instruction_and_the_types(case, space):
    program, fragments = MALFORMED[case]
    with pytest.raises(IllTypedProgram) as exc:
        check_types(program)
    for fragment in fragments:
        assert fragment in str(exc.value), (fragment, str(exc.value))
    # the executor fails on it too (so the static refusal is exact, not a guess)
    with pytest.raises(Exception):
        run(space, program)


# == valid programs: the check passes and the program runs ========================================
def test_loop_carried_register_that_grows_then_settles_passes(space):
    # acc starts as a scalar and becomes a [4] tile on the first trip; the later trips agree
    program = prog(
        Arange("%i", 4), Load("%v", "src", "%i"), Const("%acc", 0.0, "float32"),
        Loop("%k", 0, 3, 1, (Binary("%acc", "add", "%acc", "%v"),)),
        Store("dst", "%i", "%acc"))
    check_types(program)
    np.testing.assert_array_equal(run(space, program)[:4], np.arange(4, dtype=np.float32) * 3)


def test_run_time_loop_bound_makes_a_changing_register_unknown_not_refused(space):
    # with n = 0 the store writes the scalar 0; with n > 0 a [4] tile: both run, neither is refused
    params = F32 + (Param("n", "scalar", "int64"),)
    program = prog(
        Arange("%i", 4), Load("%v", "src", "%i"), Const("%acc", 0.0, "float32"), ScalarArg("%n", "n"),
        Loop("%k", 0, "%n", 1, (Binary("%acc", "add", "%acc", "%v"),)),
        Store("dst", "%i", "%acc"), params=params)
    check_types(program)
    for n in (0, 2):
        np.testing.assert_array_equal(run(space, program, scalars={"n": n})[:4],
                                      np.arange(4, dtype=np.float32) * n)


def test_zero_trip_loop_keeps_the_types_from_before(space):
    program = prog(
        Arange("%i", 4), Const("%acc", 1.0, "float32"),
        Loop("%k", 0, 0, 1, (Reshape("%acc", "%i", (2, 2)),)),
        Binary("%w", "add", "%acc", "%acc"), Convert("%wi", "%w", "float32"), Store("dst", "%i", "%wi"))
    check_types(program)
    np.testing.assert_array_equal(run(space, program)[:4], np.full(4, 2.0, np.float32))


def test_broadcasting_where_dot_reduce_and_masks_pass(space):
    program = prog(
        ProgramId("%pid"), Arange("%r", 2), Reshape("%rc", "%r", (2, 1)), Arange("%c", 4),
        Const("%four", 4, "int64"), Binary("%row", "mul", "%rc", "%four"),
        Binary("%off", "add", "%row", "%c"),                       # [2,1] + [4] -> [2,4]
        Const("%lim", 6, "int64"), Binary("%m", "lt", "%off", "%lim"),
        Load("%a", "src", "%off", "%m"),                           # float32[2,4], masked
        Arange("%k", 4), Reshape("%kc", "%k", (4, 1)), Binary("%boff", "add", "%kc", "%c"),
        Load("%b", "src", "%boff"),                                # float32[4,4]
        Const("%z", 0.0, "float32"), Broadcast("%acc", "%z", (2, 4)),
        Dot("%d", "%a", "%b", "%acc"),                             # [2,4]
        Reduce("%s", "max", "%d", -1), Reduce("%arg", "argmax", "%d", 1),
        Convert("%argf", "%arg", "float32"),
        Where("%o", "%m", "%s", "%argf"),                          # bool[2,4], [2,1], [2,1]
        Unary("%isn", "isnan", "%o"), Unary("%ok", "not", "%isn"), Where("%o2", "%ok", "%o", "%z"),
        StoreReduce("dst", "%off", "%o2", "sum", "%m"))
    check_types(program)
    a = np.where(np.arange(8).reshape(2, 4) < 6, np.arange(8).reshape(2, 4), 0).astype(np.float64)
    b = (np.arange(4)[:, None] + np.arange(4)).astype(np.float64)
    d = a @ b
    want = np.where(np.arange(8).reshape(2, 4) < 6, d.max(1, keepdims=True), d.argmax(1)[:, None])
    got = run(space, program)[:8]
    np.testing.assert_allclose(got[:6], want.ravel()[:6], rtol=1e-6)
    assert not got[6:].any()                                       # masked-off lanes: untouched


def test_where_promotes_like_the_executor():
    program = prog(
        Arange("%i", 4), Load("%v", "src", "%i"), Binary("%m", "lt", "%i", "%i"),
        Where("%w", "%m", "%v", "%i"), Convert("%f", "%w", "float32"), Store("dst", "%i", "%f"))
    check_types(program)


def test_check_module_collects_every_refused_kernel():
    good = prog(Arange("%i", 4), Load("%v", "src", "%i"), Store("dst", "%i", "%v"), name="good")
    bad1 = MALFORMED["shapes do not broadcast"][0]
    bad2 = prog(*MALFORMED["reshape cannot hold"][0].body, name="bad2")
    assert check_module({"good": good}) == {"good": good}
    with pytest.raises(IllTypedProgram) as exc:
        check_module({"good": good, "k": bad1, "bad2": bad2})
    text = str(exc.value)
    assert text.count("error: ") == 2 and "'k'" in text and "'bad2'" in text and "'good'" not in text
