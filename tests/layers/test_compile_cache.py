"""The compile cache: content-addressed keys, memory and disk levels, corrupt entries rebuilt."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.layers import compile_cache
from fornax.layers.compiler import CompileOptions, Target
from fornax.layers.graph import DType, Graph
from fornax.scenarios.workloads import WORKLOADS
from fornax.stack import compose, get_vendor, make_config
from helpers import FAMILIES

TARGETS = {"cuda-like": Target("sm_90", "ptx-like", 132), "rocm-like": Target("gfx942", "hsaco-like", 304),
           "xpu-like": Target("pvc", "spirv-like", 128)}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FORNAX_CACHE_DIR", str(tmp_path))
    return tmp_path


def entries(d):
    return sorted((d / "compile").glob("*.fxcc")) if (d / "compile").exists() else []


def graph(scale: float = 1.0) -> Graph:
    g = Graph("cached")
    x = g.input("x", (16, 32), DType.FLOAT32)
    w = g.constant((np.arange(32 * 8, dtype=np.float32).reshape(32, 8) / 100) * scale, "w")
    g.output(g.op("softmax", g.op("relu", g.op("matmul", x, w)), axis=-1))
    return g


def fresh(vendor: str = "xpu-like"):
    return get_vendor(vendor).compiler()


@pytest.mark.parametrize("vendor", FAMILIES)
def test_a_disk_hit_in_a_new_compiler_returns_an_identical_binary(vendor, cache_dir):
    g = graph()
    first = fresh(vendor).compile(g, TARGETS[vendor])
    assert len(entries(cache_dir)) == 1
    second_compiler = fresh(vendor)
    again = second_compiler.compile(g, TARGETS[vendor])
    assert again is not first
    assert again.binary == first.binary and again.binary.data == first.binary.data
    assert again.steps == first.steps and again.programs == first.programs
    assert (again.inputs, again.outputs, again.log) == (first.inputs, first.outputs, first.log)
    # the constant is re-attached from the graph being compiled, not a stored copy
    (wbuf,) = [b for b in again.buffers.values() if b.role == "constant"]
    assert wbuf.data is g.constants[0].const
    rep = second_compiler.report()
    assert rep["compile_cache"]["disk_hits"] == 1 and rep["compile_cache"]["misses"] == 0
    assert rep["cache_hits"] == 1 and rep["graphs_compiled"] == 0
    # a third compile in the same compiler is a memory hit
    assert second_compiler.compile(g, TARGETS[vendor]) is again
    assert second_compiler.report()["compile_cache"]["memory_hits"] == 1


def test_the_key_changes_with_graph_constants_target_compiler_and_options(cache_dir):
    g = graph()
    base = fresh().compile(g, TARGETS["xpu-like"])
    changes = [
        lambda c: c.compile(graph(scale=2.0), TARGETS["xpu-like"]),                    # constant bytes
        lambda c: c.compile(g, replace(TARGETS["xpu-like"], compute_units=64)),        # target
        lambda c: c.compile(g, Target("pvc", "zebin-like", 128)),                      # format
        lambda c: c.compile(g, TARGETS["xpu-like"], options=CompileOptions(fuse=False)),  # options
        lambda c: c.compile(g, TARGETS["xpu-like"], frozenset({"matmul"})),            # routines
    ]
    for i, change in enumerate(changes):
        c = fresh()
        change(c)
        assert c.report()["compile_cache"]["misses"] == 1, i
        assert len(entries(cache_dir)) == i + 2
    # another graph text with the same constants misses too
    h = graph()
    h.name = "renamed"
    c = fresh()
    c.compile(h, TARGETS["xpu-like"])
    assert c.report()["compile_cache"]["misses"] == 1
    # and the unchanged compile still hits
    c = fresh()
    assert c.compile(g, TARGETS["xpu-like"]).binary.data == base.binary.data
    assert c.report()["compile_cache"]["disk_hits"] == 1


def test_another_family_or_version_gets_its_own_key():
    g = graph()
    t = TARGETS["xpu-like"]
    key = compile_cache.cache_key(g, t, {"vendor": "xpu-like", "fornax": "1"}, "o")
    assert key != compile_cache.cache_key(g, t, {"vendor": "xpu-like", "fornax": "2"}, "o")
    assert key != compile_cache.cache_key(g, t, {"vendor": "cuda-like", "fornax": "1"}, "o")
    assert key == compile_cache.cache_key(graph(), t, {"vendor": "xpu-like", "fornax": "1"}, "o")


@pytest.mark.parametrize("where", ["magic", "version", "checksum", "middle", "last", "truncated",
                                   "empty"])
def test_a_corrupt_entry_is_discarded_and_rebuilt_never_loaded(where, cache_dir):
    g = graph()
    good = fresh().compile(g, TARGETS["xpu-like"])
    (path,) = entries(cache_dir)
    data = bytearray(path.read_bytes())
    if where == "truncated":
        data = data[: len(data) // 2]
    elif where == "empty":
        data = bytearray()
    else:
        pos = {"magic": 0, "version": 4, "checksum": 12, "middle": len(data) // 2, "last": len(data) - 1}[where]
        data[pos] ^= 0x5A
    path.write_bytes(bytes(data))
    c = fresh()
    plan = c.compile(g, TARGETS["xpu-like"])
    stats = c.report()["compile_cache"]
    assert stats["corrupt"] == 1 and stats["disk_hits"] == 0 and stats["misses"] == 1
    assert stats["disk_writes"] == 1 and c.report()["graphs_compiled"] == 1      # rebuilt
    assert plan.binary.data == good.binary.data
    assert path.read_bytes()[:4] == b"FXCC"
    # the rebuilt entry is whole again: the next compiler loads it
    c2 = fresh()
    c2.compile(g, TARGETS["xpu-like"])
    assert c2.report()["compile_cache"]["disk_hits"] == 1


def test_a_well_framed_entry_that_does_not_decode_is_not_loaded(cache_dir):
    g = graph()
    fresh().compile(g, TARGETS["xpu-like"])
    (path,) = entries(cache_dir)
    import hashlib
    import zlib
    payload = zlib.compress(b'{"__dc__": "os:system", "fields": {}}')
    path.write_bytes(compile_cache._HEAD.pack(compile_cache.MAGIC, compile_cache.VERSION,
                                              hashlib.sha256(payload).digest()) + payload)
    c = fresh()
    c.compile(g, TARGETS["xpu-like"])
    stats = c.report()["compile_cache"]
    assert stats["corrupt"] == 1 and "not a fornax plan type" in stats["problem"]


def test_entries_are_written_whole_with_no_temporary_files_left(cache_dir):
    for scale in (1.0, 2.0, 3.0):
        fresh().compile(graph(scale), TARGETS["xpu-like"])
    names = [p.name for p in (cache_dir / "compile").iterdir()]
    assert len(names) == 3 and all(n.endswith(".fxcc") and len(n) == 64 + 5 for n in names)


def test_cache_directory_defaults_and_off(tmp_path, monkeypatch):
    monkeypatch.delenv("FORNAX_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.default_directory() == tmp_path / "xdg" / "fornax"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache.default_directory() == tmp_path / "home" / ".cache" / "fornax"
    monkeypatch.setenv("FORNAX_CACHE_DIR", "off")
    c = fresh()
    g = graph()
    c.compile(g, TARGETS["xpu-like"])
    c.compile(g, TARGETS["xpu-like"])
    stats = c.report()["compile_cache"]
    assert stats["directory"] == "off" and stats["disk_writes"] == 0 and stats["memory_hits"] == 1
    assert not (tmp_path / "home").exists()


def test_an_unwritable_cache_directory_keeps_the_memory_level(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FORNAX_CACHE_DIR", str(blocker))
    c = fresh()
    g = graph()
    c.compile(g, TARGETS["xpu-like"])
    assert c.compile(g, TARGETS["xpu-like"]) is not None
    stats = c.report()["compile_cache"]
    assert stats["not_stored"] == 1 and stats["memory_hits"] == 1 and "cannot write" in stats["problem"]


def test_a_disk_hit_runs_to_the_same_numbers_and_shows_in_the_run_report(cache_dir):
    graph_, feeds = WORKLOADS["mlp-softmax"].build(0)
    outs = []
    for _ in range(2):
        stack = compose(make_config("rocm-like", spec="tiny"))
        outs.append(stack.run(graph_, feeds).outputs[0])
    np.testing.assert_array_equal(outs[0], outs[1])
    x = feeds["x"].astype(np.float64)
    w1, b1, w2, b2 = (c.const.astype(np.float64) for c in graph_.constants)
    logits = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    ref = np.exp(logits - logits.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(outs[1], ref, rtol=1e-4, atol=1e-6)
    runner = CliRunner()
    reports = []
    for _ in range(2):
        res = runner.invoke(main, ["compose", "--vendor", "cuda-like", "--spec", "tiny", "--json"])
        assert res.exit_code == 0, res.output
        reports.append(json.loads(res.stdout)["seams"]["compiler"]["compile_cache"])
    assert reports[0]["misses"] >= 1 and reports[0]["disk_hits"] == 0
    assert reports[1]["disk_hits"] == reports[0]["misses"] and reports[1]["misses"] == 0
    assert reports[1]["directory"] == str(cache_dir)
