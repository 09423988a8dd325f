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
                "fornax": compile_cache.fornax_version(), "dnn": c.facts.get("library", {}).get("dnn"),
                "source": compile_cache.source_digest()}
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


def test_other_compiling_code_gives_another_key(monkeypatch):
    """A plan cached by other code (a checkout between releases) is never found again."""
    c = get_vendor("rocm-like").compiler()
    t = Target("gfx942", "hsaco-like", 304)
    before = c._fingerprint(graph(), t, frozenset())
    real = compile_cache.source_digest()
    assert len(real) == 64 and int(real, 16) >= 0          # a SHA-256, hex
    import fornax.layers.compiler as compiler
    monkeypatch.setattr(compiler, "source_digest", lambda: "0" * 64)
    assert get_vendor("rocm-like").compiler()._fingerprint(graph(), t, frozenset()) != before
