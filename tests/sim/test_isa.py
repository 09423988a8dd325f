"""The tile ISA: hand-built programs, encodings, verification, corrupt input."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fornax.layers import codegen
from fornax.layers.graph import DType
from fornax.sim import isa
from fornax.sim.faults import InvalidProgram
from fornax.sim.isa import (Arange, Barrier, Binary, Broadcast, Const, Convert, Dot, Load, Loop,
                            Param, Program, ProgramId, Reduce, Reshape, ScalarArg, SparseDot, Store,
                            StoreReduce, Unary, Where)


def axpy_program() -> Program:
    """y[i] = exp(a * x[i]) + y[i] for i < n, blocks of 64."""
    body = (
        ProgramId("%pid", 0),
        Const("%bs", 64, "int64"),
        Binary("%base", "mul", "%pid", "%bs"),
        Arange("%lane", 64),
        Binary("%i", "add", "%base", "%lane"),
        ScalarArg("%n", "n"),
        Binary("%mask", "lt", "%i", "%n"),
        ScalarArg("%a", "a"),
        Load("%x", "x", "%i", "%mask", 0.0),
        Load("%y", "y", "%i", "%mask"),
        Binary("%ax", "mul", "%a", "%x"),
        Unary("%e", "exp", "%ax"),
        Binary("%r", "add", "%e", "%y"),
        Store("y", "%i", "%r", "%mask"),
    )
    params = (Param("x", "ptr", "float32"), Param("y", "ptr", "float32"),
              Param("a", "scalar", "float32"), Param("n", "scalar", "int64"))
    return Program("axpy", params, body)


def every_instruction_program() -> Program:
    """Uses each instruction kind at least once (incl. a nested loop with a register bound)."""
    body = (
        ProgramId("%p", 1),
        Arange("%r", 8),
        Arange("%r4", 4),
        Reshape("%col", "%r", (8, 1)),
        Reshape("%row", "%r", (1, 8)),
        Const("%eight", 8, "int64"),
        Binary("%t", "mul", "%col", "%eight"),
        Binary("%off", "add", "%t", "%row"),
        Const("%zero", 0.0, "float32"),
        Const("%neg_inf", float("-inf"), "float32"),
        Const("%yes", True, "bool"),
        Broadcast("%acc", "%zero", (8, 8)),
        ScalarArg("%kb", "kb"),
        Loop("%k", 0, "%kb", 1, (
            Load("%ta", "a", "%off"),
            Load("%tb", "b", "%off", None, -1.5),
            Dot("%acc", "%ta", "%tb", "%acc", "float32"),
            Loop("%j", 2, 10, 4, (Barrier(),)),
        )),
        Reshape("%half", "%r4", (1, 4)),
        Binary("%soff", "add", "%t", "%half"),
        Load("%sv", "a", "%soff"),
        Const("%word", 0, "int32"),
        Broadcast("%e", "%word", (8, 1)),
        Load("%sb", "b", "%off"),
        SparseDot("%acc", "%sv", "%e", "%sb", "%acc", "float32"),
        Reduce("%mx", "max", "%acc", -1),
        Binary("%gt", "gt", "%acc", "%mx"),
        Where("%w", "%gt", "%acc", "%neg_inf"),
        Convert("%h", "%w", "bfloat16"),
        Unary("%nb", "not", "%yes"),
        Store("c", "%off", "%h", "%nb"),
        StoreReduce("c", "%off", "%h", "max", "%nb"),
    )
    params = (Param("a", "ptr", "float32"), Param("b", "ptr", "float32"),
              Param("c", "ptr", "bfloat16"), Param("kb", "scalar", "int64"))
    return Program("everything", params, body, {"kind": "test"})


PROGRAMS = [axpy_program, every_instruction_program,
            lambda: codegen.gemm_kernel("g", DType.FLOAT16, 37, 53, 29, 2, True, (32, 32, 16), 128)[0],
            lambda: codegen.gemm_kernel("gd", DType.BFLOAT16, "m", "n", "k", 1, False,
                                        (16, 16, 16), 64)[0]]


def test_hand_built_programs_verify():
    for make in PROGRAMS:
        p = make()
        assert isa.verify(p) is p
    ops = {type(i) for i in every_instruction_program().instructions()}
    assert ops == set(isa.INSTRUCTIONS.values())


def test_instructions_walks_loop_bodies_depth_first():
    names = [i.op for i in every_instruction_program().instructions()]
    k = names.index("loop")
    assert names[k:k + 6] == ["loop", "load", "load", "dot", "loop", "barrier"]


@pytest.mark.parametrize("make", PROGRAMS)
def test_encode_decode_roundtrip(make):
    p = make()
    data = isa.encode(p)
    assert isinstance(data, bytes)
    q = isa.decode(data)
    assert q == p
    assert q.body == p.body and q.params == p.params and q.name == p.name
    assert q.meta == p.meta
    assert isa.encode(q) == data


@pytest.mark.parametrize("make", PROGRAMS)
def test_disassemble_assemble_roundtrip(make):
    p = make()
    text = isa.disassemble(p)
    assert text.startswith(f".kernel {p.name}\n") and text.rstrip().endswith(".end")
    q = isa.assemble(text)
    assert q == p
    assert isa.disassemble(q) == text


def test_assembly_is_readable():
    text = isa.disassemble(axpy_program())
    assert ".param x ptr float32" in text
    assert ".param n scalar int64" in text
    assert "load dst=%x ptr=x offsets=%i mask=%mask other=0.0" in text
    assert "unary dst=%e fn=exp src=%ax" in text


def test_assemble_ignores_comments_and_other_directives():
    text = isa.disassemble(axpy_program())
    lines = text.splitlines()
    lines.insert(1, ".version 7.8")
    lines.insert(2, ".target sm_90   // a comment")
    lines.insert(5, "")
    assert isa.assemble("\n".join(lines) + "\n") == axpy_program()


# ---- random elementwise programs ---------------------------------------------------
@st.composite
def elementwise_programs(draw):
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16", "float64"]))
    n = draw(st.integers(1, 256))
    body = [ProgramId("%pid"), Arange("%lane", n), Const("%n", n, "int64"),
            Binary("%base", "mul", "%pid", "%n"), Binary("%i", "add", "%lane", "%base")]
    body.append(Load("%v0", "x", "%i", None, draw(st.floats(-10, 10, allow_nan=False))))
    regs = ["%v0"]
    for j in range(draw(st.integers(0, 8))):
        dst = f"%v{j + 1}"
        kind = draw(st.sampled_from(["unary", "binary", "const"]))
        if kind == "unary":
            body.append(Unary(dst, draw(st.sampled_from(isa.UNARY[:-1])), draw(st.sampled_from(regs))))
        elif kind == "binary":
            fn = draw(st.sampled_from(["add", "sub", "mul", "div", "max", "min", "pow"]))
            body.append(Binary(dst, fn, draw(st.sampled_from(regs)), draw(st.sampled_from(regs))))
        else:
            value = draw(st.one_of(st.integers(-1000, 1000),
                                   st.floats(allow_nan=False, width=32)))
            body.append(Const(dst, value, dtype))
        regs.append(dst)
    body.append(Store("y", "%i", regs[-1]))
    name = draw(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True))
    return Program(name, (Param("x", "ptr", dtype), Param("y", "ptr", dtype)), tuple(body))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(elementwise_programs())
def test_random_programs_roundtrip(p):
    isa.verify(p)
    assert isa.decode(isa.encode(p)) == p
    assert isa.assemble(isa.disassemble(p)) == p


# ---- verification errors -----------------------------------------------------------
def _with_body(*body, params=None):
    params = params or (Param("x", "ptr", "float32"), Param("n", "scalar", "int64"))
    return Program("bad", params, tuple(body))


def _rejects(program, *fragments):
    with pytest.raises(InvalidProgram) as info:
        isa.verify(program)
    msg = str(info.value)
    for f in fragments:
        assert f in msg, msg
    return msg


def test_verify_rejects_undefined_register():
    _rejects(_with_body(Arange("%a", 4), Binary("%b", "add", "%a", "%ghost")),
             "'bad'", "instruction 1", "%ghost", "before it is written")


def test_verify_rejects_register_defined_only_inside_a_loop_body_used_after():
    _rejects(_with_body(Loop("%k", 0, 4, 1, (Arange("%inner", 4),)),
                        Unary("%o", "neg", "%inner")), "%inner")


def test_loop_variable_is_defined_inside_only():
    isa.verify(_with_body(Loop("%k", 0, 4, 1, (Unary("%o", "neg", "%k"),))))
    _rejects(_with_body(Loop("%k", 0, 4, 1, ()), Unary("%o", "neg", "%k")), "%k")


def test_verify_rejects_unknown_functions():
    _rejects(_with_body(Arange("%a", 4), Unary("%b", "cosh", "%a")), "unknown unary function", "cosh")
    _rejects(_with_body(Arange("%a", 4), Binary("%b", "nand", "%a", "%a")),
             "unknown binary function", "nand")
    _rejects(_with_body(Arange("%a", 4), Reduce("%b", "prod", "%a", 0)), "unknown reduction", "prod")


def test_verify_rejects_load_store_on_scalar_param():
    _rejects(_with_body(Arange("%a", 4), Load("%b", "n", "%a")), "'n' is not a pointer parameter")
    _rejects(_with_body(Arange("%a", 4), Store("n", "%a", "%a")), "'n' is not a pointer parameter")
    _rejects(_with_body(Arange("%a", 4), Load("%b", "nope", "%a")), "'nope'")
    _rejects(_with_body(ScalarArg("%s", "x")), "'x' is not a scalar parameter")


def test_verify_rejects_bad_loop_bounds():
    _rejects(_with_body(Loop("%k", 0, 4, 0, ())), "non-zero step")
    _rejects(_with_body(Loop("%k", 0.5, 4, 1, ())), "loop bounds")
    _rejects(_with_body(Loop("%k", 0, 4.0, 1, ())), "loop bounds")
    _rejects(_with_body(Loop("%k", 0, "%undefined", 1, ())), "loop bound", "%undefined")


def test_verify_rejects_other_malformations():
    _rejects(_with_body(Const("%c", 1, "float128")), "unknown dtype", "float128")
    _rejects(_with_body(Const("%c", "one", "int64")), "constant must be a number")
    _rejects(_with_body(ProgramId("%p", 3)), "axis")
    _rejects(_with_body(Arange("%p", 0)), "arange length")
    _rejects(_with_body(Arange("%a", 4), Reshape("%b", "%a", (2, -2))), "shape")
    _rejects(_with_body("not an instruction"), "not an ISA instruction")
    _rejects(Program("bad", (Param("x", "ptr", "float32"), Param("x", "ptr", "float32"))),
             "declared twice")
    _rejects(Program("bad", (Param("x", "pointer", "float32"),)), "unknown kind")
    with pytest.raises(InvalidProgram):
        isa.verify(Program("", ()))


# ---- corrupt input -----------------------------------------------------------------
def test_decode_rejects_garbage():
    for data in (b"", b"\xff\xfe", b"null", b"[]", b"{}", b'{"name":"k"}',
                 b'{"name":"k","params":[1],"body":[]}',
                 b'{"name":"k","params":[],"body":[{"op":"fly"}]}',
                 b'{"name":"k","params":[],"body":[{"op":"arange","dst":"%a"}]}',
                 b'{"name":"k","params":[],"body":[{"op":"arange","dst":["x"],"n":4}]}',
                 b'{"name":"k","params":[{"name":"a","kind":"ptr","dtype":[1]}],"body":[]}',
                 b'{"name":"k","params":[],"body":[{"op":"loop","var":"%k","start":0,'
                 b'"stop":2,"step":1,"body":5}]}'):
        with pytest.raises(InvalidProgram):
            isa.decode(data)


def _decode_or_invalid(data):
    try:
        p = isa.decode(data)
    except InvalidProgram:
        return None
    assert isinstance(p, Program)
    return p


def test_decode_of_every_truncation_raises_invalid_program():
    data = isa.encode(every_instruction_program())
    for n in range(len(data)):
        with pytest.raises(InvalidProgram):
            isa.decode(data[:n])


def test_decode_of_corrupted_bytes_raises_only_invalid_program():
    data = isa.encode(every_instruction_program())
    for pos in range(len(data)):
        for byte in (0x00, 0x22, 0x5B, 0x7B, 0x31, data[pos] ^ 0x20, data[pos] ^ 0x01):
            _decode_or_invalid(data[:pos] + bytes([byte]) + data[pos + 1:])


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_decode_random_corruptions(draw):
    data = bytearray(isa.encode(axpy_program()))
    for _ in range(draw.draw(st.integers(1, 4))):
        pos = draw.draw(st.integers(0, len(data) - 1))
        data[pos] = draw.draw(st.integers(0, 255))
    _decode_or_invalid(bytes(data))


def test_assemble_of_truncated_text_raises_invalid_program():
    for make in (every_instruction_program, PROGRAMS[2]):
        text = isa.disassemble(make())
        for n in range(len(text) - 1):          # everything short of the final newline
            with pytest.raises(InvalidProgram):
                isa.assemble(text[:n])


def test_assemble_rejects_malformed_text():
    good = isa.disassemble(axpy_program())
    cases = {
        "no kernel": good.replace(".kernel axpy\n", ""),
        "unknown op": good.replace("unary dst=%e", "frobnicate dst=%e"),
        "bare token": good.replace("fn=exp", "exp"),
        "bad key": good.replace("fn=exp", "fun=exp"),
        "stray brace": good.replace(".end", "}\n.end"),
        "open loop": good.replace(".end", "loop var=%k start=0 stop=4 step=1 {\n.end"),
        "loop no brace": good.replace(".end", "loop var=%k start=0 stop=4 step=1\n.end"),
        "bad shape": ".kernel k\narange dst=%a n=4\nreshape dst=%b src=%a shape=(2,x)\n.end\n",
        "int shape": ".kernel k\narange dst=%a n=4\nreshape dst=%b src=%a shape=5\n.end\n",
    }
    for label, text in cases.items():
        with pytest.raises(InvalidProgram):
            isa.assemble(text)
