"""The three families' assembly dialects: one shared codec, the differences as data, exact round trips."""

from __future__ import annotations

import copy
import importlib
import math

import numpy as np
import pytest

from fornax.layers.compiler import Target
from fornax.layers.dialect import Dialect, parse, render
from fornax.layers.errors import BinaryError, ConfigError
from fornax.layers.graph import DType, Graph
from fornax.scenarios.workloads import WORKLOADS
from fornax.sim import isa
from fornax.sim.device import Device
from fornax.sim.faults import InvalidProgram
from fornax.sim.spec import load_spec
from fornax.stack import get_vendor
from helpers import FAMILIES

VENDORS = list(FAMILIES)
#: every format of a family with a text form, and the arch it is built for here
FORMATS = {"cuda-like": [("ptx-like", "sm_90"), ("cubin-like", "sm_90")],
           "rocm-like": [("hsaco-like", "gfx942")],
           "xpu-like": [("spirv-like", "pvc"), ("zebin-like", "pvc")]}


def compiler_module(vendor: str):
    return importlib.import_module(f"fornax.vendors.{vendor.replace('-', '_')}.compiler")


def every_instruction() -> isa.Program:
    """A kernel that uses every ISA instruction and every operand form the codec must keep."""
    P = isa
    body = (
        P.ProgramId("%r0", 0), P.ProgramId("%r1", 2), P.Arange("%r2", 16),
        P.Const("%r3", 1.5, "float32"), P.Const("%r4", 7, "int64"), P.Const("%r5", True, "bool"),
        P.Const("%r6", -0.0, "float32"), P.Const("%r7", math.inf, "float32"),
        P.Const("%r8", 1e-30, "float64"), P.Const("%r9", 3.0, "int32"),
        P.ScalarArg("%n", "n"), P.Binary("%r10", "lt", "%r2", "%n"),
        P.Load("%r11", "x", "%r2", "%r10", -1.25), P.Load("%r12", "x", "%r2"),
        P.Unary("%r13", "exp", "%r11"), P.Binary("%r14", "max", "%r13", "%r3"),
        P.Where("%r15", "%r10", "%r14", "%r3"), P.Convert("%r16", "%r15", "bfloat16"),
        P.Reshape("%r17", "%r2", (4, 4)), P.Broadcast("%r18", "%r3", (4, 4)),
        P.Reduce("%r19", "sum", "%r18", 1), P.Reduce("%r20", "max", "%r18", 0),
        P.Dot("%acc", "%r18", "%r18", "%r18", "float32"), P.Barrier(),
        P.Loop("%k", 0, "%n", 2, (P.Binary("%r21", "add", "%k", "%r4"),
                                 P.Loop("%j", 3, 9, 3, (P.Barrier(),)),
                                 P.Store("y", "%r2", "%r16", "%r10"))),
        P.Store("y", "%r2", "%r15"), P.StoreReduce("y", "%r2", "%r14", "max", None),
        P.StoreReduce("y", "%r2", "%r14", "sum", "%r10"),
        P.Unary("%odd name", "neg", "%r14"), P.Unary("%r22", "relu", "%odd name"),
    )
    params = (isa.Param("x", "ptr", "float32"), isa.Param("y", "ptr", "float32"),
              isa.Param("n", "scalar", "int64"))
    meta = {"group_size": 128, "kind": "test", "registers": 24, "shared_memory": 512,
            "estimate": {"read": {"x": [0, 64]}, "note": "a string with spaces", "flops": 1.5}}
    return isa.verify(isa.Program("every-op_kernel", params, body, meta))


def workload_programs(vendor: str):
    """The kernels one family generates for the graph workloads (GEMMs generated, not routed)."""
    out = []
    comp = get_vendor(vendor).compiler()
    fmt, arch = FORMATS[vendor][0]
    for name in ("mlp", "mlp-bf16", "softmax", "mlp-softmax"):
        graph, _ = WORKLOADS[name].build(0)
        out.extend(comp.compile(graph, Target(arch, fmt, 132), frozenset()).programs.values())
    return out


@pytest.mark.parametrize("vendor", VENDORS)
def test_every_program_round_trips_exactly(vendor):
    dialect = compiler_module(vendor).DIALECT
    programs = [every_instruction()] + workload_programs(vendor)
    assert any(isinstance(i, isa.Dot) for p in programs for i in p.instructions())
    for p in programs:
        text = render(p, dialect)
        q = parse(text, dialect)
        assert q == p and q.meta == p.meta
        assert isa.encode(q) == isa.encode(p)          # byte-identical once re-encoded
        assert render(q, dialect) == text


@pytest.mark.parametrize("vendor,fmt,arch", [(v, f, a) for v in VENDORS for f, a in FORMATS[v]])
def test_binary_to_text_to_binary_is_identical_and_loads(vendor, fmt, arch):
    mod = compiler_module(vendor)
    graph, _ = WORKLOADS["mlp-softmax"].build(0)
    plan = get_vendor(vendor).compiler().compile(graph, Target(arch, fmt, 132), frozenset())
    text = mod.disassemble(plan.binary)
    again = mod.assemble(text, fmt)
    assert (again.format, again.target, again.entry_points) == \
        (plan.binary.format, plan.binary.target, plan.binary.entry_points)
    assert again.data == plan.binary.data
    drv = get_vendor(vendor).driver([Device(load_spec("h200-like"), 0)])
    module = drv.load_module(drv.create_context(0), again)
    assert set(module.kernels) == set(plan.programs)
    assert all(module.kernels[k] == plan.programs[k] for k in plan.programs)


def test_the_three_dialects_differ_in_their_words_not_their_meaning():
    p = every_instruction()
    texts = {v: render(p, compiler_module(v).DIALECT) for v in VENDORS}
    expect = {  # matrix instruction after each family's matrix_shape, barrier, work-group id
        "cuda-like": ("mma.sync.aligned.m16n8k16.row.col.f32", "bar.sync 0", "%ctaid.x", ".maxnreg 24"),
        "rocm-like": ("v_mfma_f32_32x32x8", "s_barrier", "s_workgroup_id_x",
                      ".amdhsa_next_free_vgpr 24"),
        "xpu-like": ("OpDPAS.M8N16K16 %float", "OpControlBarrier Workgroup", "BuiltIn.WorkgroupId.x",
                     "OpExecutionMode RegisterMapIntel 24"),
    }
    for vendor, words in expect.items():
        for w in words:
            assert w in texts[vendor], (vendor, w)
        for other in VENDORS:
            if other != vendor:
                assert words[0] not in texts[other] and words[1] not in texts[other]
    # and all three read back to the same program
    assert {parse(t, compiler_module(v).DIALECT) for v, t in texts.items()} == {p}


def test_the_matrix_instruction_name_follows_the_facts():
    facts = copy.deepcopy(get_vendor("rocm-like").facts["compiler"])
    facts["matrix_shape"] = [16, 16, 16]
    d = Dialect.from_facts(facts)
    dot = isa.Program("k", (), (isa.Const("%r0", 0.0, "float32"),
                                isa.Dot("%r1", "%r0", "%r0", "%r0", "float32")))
    text = render(dot, d)
    assert "v_mfma_f32_16x16x16" in text and "32x32x8" not in text
    with pytest.raises(InvalidProgram):          # the 32x32x8 dialect does not read a 16x16x16 MFMA
        parse(text, compiler_module("rocm-like").DIALECT)


def test_a_dialect_without_an_instruction_template_is_a_config_error():
    facts = copy.deepcopy(get_vendor("xpu-like").facts["compiler"])
    del facts["dialect"]["ops"]["dot"]
    with pytest.raises(ConfigError, match="dot"):
        Dialect.from_facts(facts)
    facts = copy.deepcopy(get_vendor("xpu-like").facts["compiler"])
    facts["dialect"]["types"]["float16"] = "float"          # two dtypes, one name: not invertible
    with pytest.raises(ConfigError, match="types"):
        Dialect.from_facts(facts)


@pytest.mark.parametrize("vendor", VENDORS)
def test_damaged_text_is_an_invalid_program_never_a_crash(vendor):
    d = compiler_module(vendor).DIALECT
    text = d.render_module([every_instruction()], {"target": "t", })
    lines = text.splitlines()
    for n in range(len(lines)):                              # every truncation
        with pytest.raises(InvalidProgram):
            d.parse_module("\n".join(lines[:n]))
    body = next(i for i, line in enumerate(lines) if line.startswith("  ") and "=" not in line[:3]
                and i > 8)
    bad = lines[:body] + [lines[body] + " extra"] + lines[body + 1:]
    with pytest.raises(InvalidProgram, match="line"):
        d.parse_module("\n".join(bad))
    f32 = d.types["float32"]
    with pytest.raises(InvalidProgram, match="float99"):
        d.parse_module(text.replace(f32, "float99", 1) if f32 != "float" else
                       text.replace("%float", "%float99", 1))


def test_cuda_like_ptx_is_the_dialect_text_and_the_driver_jits_it():
    from fornax.vendors.cuda_like.compiler import DIALECT, ptx_image
    p = every_instruction()
    binary = ptx_image([p], "sm_80", "test")
    text = binary.data.decode()
    assert text.startswith(".version 8.0\n.target compute_80\n")
    assert ".visible .entry every-op_kernel {" in text
    drv = get_vendor("cuda-like").driver([Device(load_spec("h200-like"), 0)])
    module = drv.load_module(drv.create_context(0), binary)
    assert module.how == "jit" and module.kernels["every-op_kernel"] == p
    # a PTX-like text without its .version prelude is rejected as invalid PTX (218)
    with pytest.raises(BinaryError) as exc:
        drv.load_module(drv.create_context(0), type(binary)(binary.format, binary.target,
                        binary.entry_points, text.split("\n", 1)[1].encode()))
    assert exc.value.code.value == 218 and ".version" in str(exc.value)
    assert DIALECT.name == "PTX-like"


def test_a_generated_kernel_runs_the_same_after_a_text_round_trip():
    """Reassembled SPIR-V-like text computes what the original computes (float64 reference)."""
    from fornax.vendors.xpu_like import compiler as xc
    g = Graph("rt")
    x = g.input("x", (8, 32), DType.FLOAT32)
    g.output(g.op("softmax", x, axis=-1))
    plan = get_vendor("xpu-like").compiler().compile(g, Target("pvc", "spirv-like", 4), frozenset())
    binary = xc.assemble(xc.disassemble(plan.binary), "spirv-like")
    drv = get_vendor("xpu-like").driver([Device(load_spec("tiny"), 0)])
    ctx = drv.create_context(0)
    module = drv.load_module(ctx, binary)
    (step,) = plan.steps
    q = drv.create_queue(ctx)
    xs = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
    ptrs = {bid: drv.allocate(ctx, b.nbytes) for bid, b in plan.buffers.items()}
    q.copy_h2d(ptrs[plan.inputs[0]], xs)
    q.launch(module, step.entry, step.grid, {k: ptrs[b] for k, b in step.args.items()})
    y = np.empty((8, 32), np.float32)
    q.copy_d2h(y, ptrs[plan.outputs[0]])
    q.synchronize()
    x64 = xs.astype(np.float64)
    ref = np.exp(x64 - x64.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-7)
