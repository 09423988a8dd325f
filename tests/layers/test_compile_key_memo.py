"""The compile-cache key on the hit path: the compiler's identity is worked out once, and the
key is the same content address it was (so disk entries stay valid)."""

from __future__ import annotations

from fornax.layers import compile_cache
from fornax.layers.compiler import CompileOptions, Target
from fornax.layers.graph import Graph
from fornax.stack import get_vendor


def graph() -> Graph:
    g = Graph("memo")
    a, b = g.input("a", (8, 8), "float32"), g.input("b", (8, 8), "float32")
    g.output(g.op("add", a, b))
    return g


def test_the_key_is_the_content_address_of_the_compiler_identity():
    c = get_vendor("cuda-like").compiler()
    t = Target("sm_90", "ptx-like", 132)
    identity = {"vendor": c.vendor, "compiler": c.facts["compiler"],
                "fornax": compile_cache.fornax_version(), "dnn": c.facts.get("library", {}).get("dnn")}
    routines = frozenset({"matmul"})
    expect = compile_cache.cache_key(graph(), t, identity, f"{sorted(routines)}|{CompileOptions().key()}")
    assert c._fingerprint(graph(), t, routines, CompileOptions()) == expect
    assert c._fingerprint(graph(), t, routines, CompileOptions()) == expect       # memoised: same


def test_other_facts_give_another_key():
    c = get_vendor("xpu-like").compiler()
    t = Target("pvc", "spirv-like", 128)
    before = c._fingerprint(graph(), t, frozenset())
    c.facts = {**c.facts, "compiler": {**c.facts["compiler"], "name": "another-compiler"}}
    after = c._fingerprint(graph(), t, frozenset())
    assert after != before
    assert get_vendor("xpu-like").compiler()._fingerprint(graph(), t, frozenset()) == before
