"""`fornax compile`: each stage of a family's compiler, three dialects for one graph."""

from __future__ import annotations

import importlib
import re

import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.scenarios.workloads import WORKLOADS
from fornax.stack import compose, make_config
from helpers import FAMILIES

VENDORS = list(FAMILIES)


def run(*args):
    result = CliRunner().invoke(main, ["compile", *args])
    return result.exit_code, result.stdout_bytes, result.stderr


def dialect(vendor):
    return importlib.import_module(f"fornax.vendors.{vendor.replace('-', '_')}.compiler").DIALECT


def mnemonics(text: str, d) -> set[str]:
    """The instruction words of a listing: each body line's first word that is not a register."""
    words = set()
    for line in text.splitlines():
        if not line.startswith("  ") or line.strip().startswith(d.comment):
            continue
        toks = line.split()
        if len(toks) > 2 and toks[1] == "=":
            toks = toks[2:]
        words.add(toks[0])
    return words


def test_one_graph_gives_three_visibly_different_dialects_that_round_trip():
    texts, words = {}, {}
    for vendor in VENDORS:
        code, out, err = run("--workload", "softmax", "--vendor", vendor, "--emit", "asm", "--spec", "tiny")
        assert code == 0, err
        texts[vendor] = out.decode()
        words[vendor] = mnemonics(texts[vendor], dialect(vendor))
        # the listing is exactly the kernels the compiler generated for the stack's target
        stack = compose(make_config(vendor, spec="tiny"))
        graph, _ = WORKLOADS["softmax"].build(0)
        plan = stack.compiler.compile(graph, stack.target, frozenset(stack.library.ops()))
        _, programs = dialect(vendor).parse_module(texts[vendor])
        assert {p.name: p for p in programs} == plan.programs and programs
    for a in VENDORS:
        for b in VENDORS:
            if a < b:
                assert not words[a] & words[b], (a, b, words[a] & words[b])
    assert texts["cuda-like"].startswith(".version 8.0\n.target compute_80\n")
    assert re.search(r"^\.amdgcn_target \"amdgcn-amd-amdhsa--gfx\d+", texts["rocm-like"], re.M)
    assert texts["xpu-like"].startswith("OpCapability Kernel\n")
    assert "%ctaid.x" in texts["cuda-like"] and "s_workgroup_id_x" in texts["rocm-like"] \
        and "BuiltIn.WorkgroupId.x" in texts["xpu-like"]


def test_asm_shows_the_familys_matrix_instruction_for_generated_gemms():
    code, out, _ = run("--workload", "mlp", "--vendor", "xpu-like", "--emit", "asm")
    assert code == 0
    assert "OpDPAS.M8N16K16 %float" in out.decode()


def test_graph_and_ir_stages(tmp_path):
    graph, _ = WORKLOADS["mlp-softmax"].build(0)
    code, out, _ = run("--workload", "mlp-softmax", "--vendor", "cuda-like", "--emit", "graph")
    assert code == 0 and out.decode() == str(graph) + "\n"
    code, out, _ = run("--workload", "mlp-softmax", "--vendor", "rocm-like", "--emit", "ir")
    ir = out.decode()
    assert code == 0 and "// fuse:" in ir and "// codegen:" in ir
    fused = len(re.findall(r"^kernel \d+", ir, re.M))
    code, out, _ = run("--workload", "mlp-softmax", "--vendor", "rocm-like", "--emit", "ir", "--no-fuse")
    unfused = len(re.findall(r"^kernel \d+", out.decode(), re.M))
    assert code == 0 and unfused > fused
    path = tmp_path / "ir.txt"
    code, out, _ = run("--workload", "mlp-softmax", "--vendor", "rocm-like", "--emit", "ir", "-o", str(path))
    assert code == 0 and out == b"" and path.read_text() == ir


@pytest.mark.parametrize("vendor,magic", [("cuda-like", b".version"), ("rocm-like", b"\x7fELF"),
                                          ("xpu-like", (0x07230203).to_bytes(4, "little"))])
def test_binary_goes_to_a_file_or_a_pipe(vendor, magic, tmp_path):
    stack = compose(make_config(vendor))
    graph, _ = WORKLOADS["softmax"].build(0)
    plan = stack.compiler.compile(graph, stack.target, frozenset(stack.library.ops()))
    path = tmp_path / "k.bin"
    code, out, _ = run("--workload", "softmax", "--vendor", vendor, "--emit", "binary", "-o", str(path))
    assert code == 0 and out == b""
    assert path.read_bytes() == plan.binary.data and plan.binary.data.startswith(magic)
    code, out, _ = run("--workload", "softmax", "--vendor", vendor, "--emit", "binary")  # not a TTY
    assert code == 0 and out == plan.binary.data


@pytest.mark.parametrize("args,words", [
    (["--workload", "nope", "--vendor", "cuda-like", "--emit", "asm"], ["unknown workload 'nope'"]),
    (["--workload", "mlp", "--vendor", "nvidia", "--emit", "asm"], ["unknown vendor 'nvidia'"]),
    (["--workload", "mlp", "--vendor", "cuda-like", "--emit", "sass"], ["sass", "graph, ir, asm, binary"]),
    (["--workload", "mlp", "--vendor", "cuda-like"], ["--emit"]),
    (["--workload", "llama70b-step", "--vendor", "cuda-like", "--emit", "ir"], ["not a graph"]),
    (["--workload", "mlp", "--vendor", "cuda-like", "--emit", "asm", "--format", "hsaco-like"],
     ["hsaco-like", "ptx-like"]),
    (["--workload", "mlp", "--vendor", "cuda-like", "--emit", "graph", "--spec", "nope"], ["nope"]),
])
def test_bad_input_is_one_line_and_exit_2(args, words):
    code, out, err = run(*args)
    assert code == 2 and out == b""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for w in words:
        assert w in err
