"""Paged KV-cache routines (layers/paged.py, kernels in layers/codegen_paged.py) on every family.

``paged_attention`` is checked against a numpy float64 reference computed from the very
cache contents the device holds (rounded to the storage dtype first), gathered through the
same block tables: non-contiguous, shuffled physical blocks, several sequences of different
context lengths in one launch, decode rows (one query) beside prefill chunks (several
queries over context cached before them), grouped-query and multi-head attention, float32
and bfloat16, every block size of the family's ``[library.dnn.paged_attention]`` table.
Everything the kernel must never read holds NaN (unused physical blocks, cache rows past a
sequence's length) or an out-of-range block id (block-table entries past a sequence's
length), so a read outside the contract shows as a NaN or a page fault.  Tolerances are
tests/layers/test_dnn.py's (float32 accumulation, probabilities rounded to the storage dtype
before the second product, one rounding of the output).

``paged_cache_write`` must copy rows bit for bit to their slots and leave every other row,
and every padding token (negative slot), alone.
"""

from __future__ import annotations

import copy
import tomllib
from importlib import resources

import ml_dtypes
import numpy as np
import pytest

from fornax.layers.errors import ConfigError, LibraryError
from fornax.stack import get_vendor
from fornax.vendors import check_facts
from helpers import FAMILIES
from helpers import LibraryDevice as Dev
from helpers import library_device as dev

VENDORS = FAMILIES
NP = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
      "bfloat16": np.dtype(ml_dtypes.bfloat16)}
TOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}
API = {  # routine -> the family's API name, by hand
    "cuda-like": {"paged_attention": "cudnn_frontend sdpa (paged K/V)",
                  "paged_cache_write": "cudnn_frontend paged K/V append"},
    "rocm-like": {"paged_attention": "aiter paged_attention",
                  "paged_cache_write": "aiter reshape_and_cache"},
    "xpu-like": {"paged_attention": "ipex PagedAttention.single_query_cached_kv_attention",
                 "paged_cache_write": "ipex PagedAttention.reshape_and_cache"},
}
#: a block-table entry no kernel may follow (its block lies far outside the cache)
NEVER = np.iinfo(np.int32).max




def paged_facts(vendor: str) -> dict:
    return get_vendor(vendor).facts["library"]["dnn"]["paged_attention"]


def check(got: np.ndarray, ref: np.ndarray, dtype: str, what: str) -> None:
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    assert np.isfinite(got.astype(np.float64)).all(), f"{what}: non-finite output (read outside the contract)"
    err = np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-3)
    assert err <= TOL[dtype], f"{what} ({dtype}): relative error {err:.2e} > {TOL[dtype]:.0e}"


def reference(q, kc, vc, tables, seq_lens, query_start, heads, kv_heads, scale):
    """float64 causal attention of each sequence's query rows over its cached context,
    gathered through its block table; rows outside every sequence stay NaN."""
    block = kc.shape[1]
    out = np.full(q.shape, np.nan)
    for s, length in enumerate(seq_lens):
        lo, hi = int(query_start[s]), int(query_start[s + 1])
        pos = np.arange(length)
        k = kc[tables[s, pos // block], pos % block].astype(np.float64)     # [L, kv_heads, d]
        v = vc[tables[s, pos // block], pos % block].astype(np.float64)
        for i, t in enumerate(range(lo, hi)):
            p = length - (hi - lo) + i                                        # its position
            for h in range(heads):
                kh = h // (heads // kv_heads)
                sc = scale * (k[:p + 1, kh] @ q[t, h].astype(np.float64))
                w = np.exp(sc - sc.max())
                out[t, h] = (w / w.sum()) @ v[:p + 1, kh]
    return out


def paged_case(vendor, dtype, heads, kv_heads, head_dim, block, seqs, seed=0, pad_tokens=2):
    """Run paged attention on ``seqs`` ((q_len, seq_len) pairs) and compare with the
    reference; returns the call record."""
    d, rng = dev(vendor), np.random.default_rng(seed)
    dt = NP[dtype]
    need = [-(-length // block) for _, length in seqs]
    max_blocks = max(need) + 1                                 # a spare column per sequence
    num_blocks = sum(need) + 3                                 # and blocks nobody owns
    kc = np.full((num_blocks, block, kv_heads, head_dim), np.nan).astype(dt)
    vc = np.full_like(kc, np.nan)
    physical = rng.permutation(num_blocks)                     # shuffled, non-contiguous
    tables = np.full((len(seqs), max_blocks), NEVER, np.int32)
    used = 0
    for s, (_, length) in enumerate(seqs):
        tables[s, :need[s]] = physical[used:used + need[s]]
        used += need[s]
        pos = np.arange(length)                                # only the context is real data
        kc[tables[s, pos // block], pos % block] = rng.standard_normal((length, kv_heads, head_dim))
        vc[tables[s, pos // block], pos % block] = rng.standard_normal((length, kv_heads, head_dim))
    seq_lens = np.array([length for _, length in seqs], np.int32)
    query_start = np.concatenate([[0], np.cumsum([ql for ql, _ in seqs])]).astype(np.int32)
    num_tokens = int(query_start[-1]) + pad_tokens             # padding rows no sequence owns
    q = rng.standard_normal((num_tokens, heads, head_dim)).astype(dt)
    o0 = np.full(q.shape, 7.0, dt)
    po = d.put(o0)
    params = dict(num_seqs=len(seqs), num_tokens=num_tokens, max_query_len=max(ql for ql, _ in seqs),
                  max_blocks=max_blocks, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                  block_size=block, dtype=dtype)
    calls = len(d.lib.calls)
    rec = d.lib.paged_attention(d.put(q), d.put(kc), d.put(vc), d.put(tables), d.put(seq_lens),
                                d.put(query_start), po, params)
    assert len(d.lib.calls) == calls + 1 and d.lib.calls[-1] is rec
    got = d.get(po, q.shape, dt)
    ref = reference(q, kc, vc, tables, seq_lens, query_start, heads, kv_heads, 1.0 / np.sqrt(head_dim))
    rows = int(query_start[-1])
    check(got[:rows], ref[:rows], dtype,
          f"{vendor} paged attention h={heads} kv={kv_heads} d={head_dim} block={block}")
    assert (got[rows:].astype(np.float32) == 7.0).all(), "rows outside every sequence were written"
    return rec


# == paged attention ===============================================================================
def mixed_batch(block: int) -> list[tuple[int, int]]:
    """(q_len, seq_len) of a continuous-batching step: decodes beside prefill chunks."""
    return [(1, 2 * block + 3),          # decode over a context that ends mid-block
            (37, 37 + block + 2),        # a prefill chunk after a cached one (several query tiles)
            (1, 1),                      # decode of a one-token context
            (6, 6),                      # a first prefill chunk
            (1, 3 * block)]              # decode at a block boundary


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim", [
    ("float32", 4, 2, 64), ("float32", 4, 4, 80), ("bfloat16", 4, 2, 128), ("bfloat16", 4, 4, 64)])
def test_paged_attention_matches_reference(vendor, dtype, heads, kv_heads, head_dim):
    facts = paged_facts(vendor)
    for block in facts["block_sizes"]:
        rec = paged_case(vendor, dtype, heads, kv_heads, head_dim, block, mixed_batch(block),
                         seed=block)
        assert rec.routine == "paged_attention"
        assert rec.reason.startswith(API[vendor]["paged_attention"] + ": "), rec.reason
        assert rec.algorithm in {t["name"] for t in facts["tiles"]}
        assert "causal" in rec.reason and "block table" in rec.reason
        gqa = f"{heads // kv_heads} query heads per kv head" if heads != kv_heads else \
            "one kv head per query head"
        assert gqa in rec.reason


@pytest.mark.parametrize("vendor", VENDORS)
def test_paged_attention_decode_uses_one_query_row(vendor):
    block = paged_facts(vendor)["block_sizes"][0]
    rec = paged_case(vendor, "float32", 4, 1, 64, block,
                     [(1, 5), (1, 4 * block + 1), (1, block)], seed=5, pad_tokens=0)
    assert "one query row per instance (decode)" in rec.reason, rec.reason


@pytest.mark.parametrize("vendor", VENDORS)
def test_paged_attention_scale(vendor):
    d, rng = dev(vendor), np.random.default_rng(9)
    block = paged_facts(vendor)["block_sizes"][-1]
    kc = rng.standard_normal((2, block, 1, 32)).astype(np.float32)
    vc = rng.standard_normal((2, block, 1, 32)).astype(np.float32)
    tables = np.array([[1, 0]], np.int32)
    q = rng.standard_normal((3, 2, 32)).astype(np.float32)
    seq_lens, query_start = np.array([block + 2], np.int32), np.array([0, 3], np.int32)
    po = d.put(np.zeros_like(q))
    d.lib.paged_attention(d.put(q), d.put(kc), d.put(vc), d.put(tables), d.put(seq_lens),
                          d.put(query_start), po,
                          dict(num_seqs=1, num_tokens=3, max_query_len=3, max_blocks=2, heads=2,
                               kv_heads=1, head_dim=32, block_size=block, scale=0.5))
    ref = reference(q, kc, vc, tables, seq_lens, query_start, 2, 1, 0.5)
    check(d.get(po, q.shape, np.float32), ref, "float32", "paged attention, scale 0.5")


# == cache write ===================================================================================
@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cache_write_stores_rows_at_their_slots(vendor, dtype):
    d, rng = dev(vendor), np.random.default_rng(1)
    dt = NP[dtype]
    block = paged_facts(vendor)["block_sizes"][0]
    nb, kvh, hd, tokens = 5, 2, 64, 11
    old_k = rng.standard_normal((nb, block, kvh, hd)).astype(dt)
    old_v = rng.standard_normal((nb, block, kvh, hd)).astype(dt)
    k = rng.standard_normal((tokens, kvh, hd)).astype(dt)
    v = rng.standard_normal((tokens, kvh, hd)).astype(dt)
    slots = rng.permutation(nb * block)[:tokens].astype(np.int64)       # shuffled, distinct
    slots[[3, tokens - 1]] = -1                                         # padding tokens
    slots[6] = nb * block                                               # past the cache: skipped
    pk, pv = d.put(old_k), d.put(old_v)
    rec = d.lib.paged_cache_write(d.put(k), d.put(v), pk, pv, d.put(slots),
                                  dict(num_tokens=tokens, num_blocks=nb, block_size=block,
                                       kv_heads=kvh, head_dim=hd, dtype=dtype))
    want_k, want_v = old_k.copy(), old_v.copy()
    for t, s in enumerate(slots):
        if 0 <= s < nb * block:
            want_k[s // block, s % block] = k[t]
            want_v[s // block, s % block] = v[t]
    got_k, got_v = d.get(pk, old_k.shape, dt), d.get(pv, old_v.shape, dt)
    assert got_k.tobytes() == want_k.tobytes() and got_v.tobytes() == want_v.tobytes()
    untouched = np.ones((nb, block), bool)
    for s in slots[(slots >= 0) & (slots < nb * block)]:
        untouched[s // block, s % block] = False
    assert untouched.sum() == nb * block - (tokens - 3)
    assert (got_k[untouched] == old_k[untouched]).all()                 # old contents kept
    assert rec.routine == "paged_cache_write" and d.lib.calls[-1] is rec
    assert rec.reason.startswith(API[vendor]["paged_cache_write"] + ": "), rec.reason


@pytest.mark.parametrize("vendor", VENDORS)
def test_write_then_attend_is_dense_causal_attention(vendor):
    """A serving step by step on one stream: a prompt's K/V written with the cache write, its
    prefill attention, then one decode step (write the new token, attend)."""
    d, rng = dev(vendor), np.random.default_rng(4)
    block = paged_facts(vendor)["block_sizes"][0]
    heads, kvh, hd, prompt = 4, 2, 32, 2 * block + 3
    nb, mb = 6, 4
    tables = np.array([[4, 1, 5, 0]], np.int32)
    kc, vc = d.put(np.zeros((nb, block, kvh, hd), np.float32)), d.put(np.zeros((nb, block, kvh, hd), np.float32))
    pt = d.put(tables)
    keys = rng.standard_normal((prompt + 1, kvh, hd)).astype(np.float32)
    vals = rng.standard_normal((prompt + 1, kvh, hd)).astype(np.float32)
    qs = rng.standard_normal((prompt + 1, heads, hd)).astype(np.float32)

    def slots_of(pos):
        return (tables[0, pos // block] * block + pos % block).astype(np.int64)

    def step(first, count):
        pos = np.arange(first, first + count)
        d.lib.paged_cache_write(d.put(keys[pos]), d.put(vals[pos]), kc, vc, d.put(slots_of(pos)),
                                dict(num_tokens=count, num_blocks=nb, block_size=block,
                                     kv_heads=kvh, head_dim=hd))
        po = d.put(np.zeros((count, heads, hd), np.float32))
        d.lib.paged_attention(d.put(qs[pos]), kc, vc, pt, d.put(np.array([first + count], np.int32)),
                              d.put(np.array([0, count], np.int32)), po,
                              dict(num_seqs=1, num_tokens=count, max_query_len=count, max_blocks=mb,
                                   heads=heads, kv_heads=kvh, head_dim=hd, block_size=block))
        return d.get(po, (count, heads, hd), np.float32)

    got = np.concatenate([step(0, prompt), step(prompt, 1)])
    n = prompt + 1
    k64 = np.repeat(keys.astype(np.float64), heads // kvh, axis=1)       # [n, heads, hd]
    v64 = np.repeat(vals.astype(np.float64), heads // kvh, axis=1)
    sc = np.einsum("qhd,khd->hqk", qs.astype(np.float64), k64) / np.sqrt(hd)
    sc = np.where(np.tril(np.ones((n, n), bool)), sc, -np.inf)
    w = np.exp(sc - sc.max(-1, keepdims=True))
    ref = np.einsum("hqk,khd->qhd", w / w.sum(-1, keepdims=True), v64)
    check(got, ref, "float32", f"{vendor} write-then-attend")


# == bad input =====================================================================================
#: a params value that means "leave the key out"
_MISSING = object()


def _params(p: dict, over: dict) -> dict:
    return {k: v for k, v in (p | over).items() if v is not _MISSING}


def _attn_params(**over):
    return _params(dict(num_seqs=1, num_tokens=1, max_query_len=1, max_blocks=1, heads=4,
                        kv_heads=2, head_dim=64, block_size=16, dtype="float32"), over)


def _write_params(**over):
    return _params(dict(num_tokens=1, num_blocks=1, block_size=16, kv_heads=2, head_dim=64,
                        dtype="float32"), over)


@pytest.mark.parametrize("vendor", VENDORS)
def test_unsupported_sizes_and_dtypes_name_routine_and_supported_values(vendor):
    d, facts = dev(vendor), paged_facts(vendor)
    p = d.rt.malloc(4096)
    dims = ", ".join(map(str, facts["head_dims"]))
    sizes = ", ".join(map(str, facts["block_sizes"]))
    dtypes = ", ".join(get_vendor(vendor).facts["library"]["dnn"]["dtypes"])

    def attn(**over):
        return d.lib.paged_attention(p, p, p, p, p, p, p, _attn_params(**over))

    def write(**over):
        return d.lib.paged_cache_write(p, p, p, p, p, _write_params(**over))

    calls = len(d.lib.calls)
    for routine, call in (("paged_attention", attn), ("paged_cache_write", write)):
        with pytest.raises(LibraryError) as info:
            call(head_dim=48)
        assert f"{routine}: head dim 48 is not supported" in str(info.value)
        assert f"(supported: {dims})" in str(info.value) and info.value.hint
        with pytest.raises(LibraryError) as info:
            call(block_size=7)
        assert f"{routine}: block size 7 is not supported" in str(info.value)
        assert f"(supported: {sizes})" in str(info.value) and info.value.hint
        with pytest.raises(LibraryError) as info:
            call(dtype="float64")
        assert f"{routine} does not support dtype 'float64' (supports {dtypes})" in str(info.value)
        with pytest.raises(LibraryError, match=f"{routine}: sizes must be positive"):
            call(head_dim=0)
        with pytest.raises(LibraryError, match=f"{routine}: missing size\\(s\\) 'num_tokens'"):
            call(num_tokens=_MISSING)
    with pytest.raises(LibraryError) as info:
        attn(heads=6, kv_heads=4)
    assert "paged_attention: heads=6 is not a multiple of kv_heads=4" in str(info.value)
    with pytest.raises(LibraryError, match="max_query_len=5 exceeds num_tokens=2"):
        attn(max_query_len=5, num_tokens=2)
    with pytest.raises(LibraryError, match="scale must be a finite number"):
        attn(scale=float("nan"))
    assert len(d.lib.calls) == calls                     # nothing recorded, nothing launched


@pytest.mark.parametrize("vendor", VENDORS)
def test_shape_only_device_is_refused_before_launch(vendor):
    """No static cost estimate exists for kernels whose addresses are data: a meta device
    gets a LibraryError saying so, not a failure deep in the simulator."""
    d = Dev(vendor, meta=True)
    p = d.rt.malloc(4096)
    block = paged_facts(vendor)["block_sizes"][0]
    with pytest.raises(LibraryError, match="paged_attention: device 0 is shape-only"):
        d.lib.paged_attention(p, p, p, p, p, p, p, _attn_params(block_size=block))
    with pytest.raises(LibraryError, match="paged_cache_write: device 0 is shape-only"):
        d.lib.paged_cache_write(p, p, p, p, p, _write_params(block_size=block))
    assert d.lib.calls == [] and d.rt.driver.kernel_log.total == 0


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_family_without_the_table_says_so(vendor):
    d = Dev(vendor)
    facts = copy.deepcopy(d.lib.facts)
    del facts["library"]["dnn"]["paged_attention"]
    d.lib.facts = facts
    p = d.rt.malloc(4096)
    with pytest.raises(LibraryError, match=r"paged_attention: .* has no paged KV-cache routines"):
        d.lib.paged_attention(p, p, p, p, p, p, p, _attn_params())


def _toml(family: str) -> dict:
    text = (resources.files(f"fornax.vendors.{family.replace('-', '_')}") / "vendor.toml").read_text()
    return tomllib.loads(text)


@pytest.mark.parametrize("family", VENDORS)
@pytest.mark.parametrize("break_it, says", [
    (lambda t: t.pop("block_sizes"), "[library.dnn.paged_attention] is missing the key 'block_sizes'"),
    (lambda t: t["tiles"][0].pop("rows"), "[library.dnn.paged_attention.tiles.0] is missing the key 'rows'"),
    (lambda t: t.__setitem__("head_dims", [64, "wide"]), "[library.dnn.paged_attention.head_dims] 1:"),
])
def test_the_paged_table_is_checked_by_the_schema(family, break_it, says):
    facts = copy.deepcopy(_toml(family))
    check_facts(facts, family)
    break_it(facts["library"]["dnn"]["paged_attention"])
    with pytest.raises(ConfigError) as info:
        check_facts(facts, f"{family}/vendor.toml")
    assert says in info.value.message and "\n" not in info.value.message, info.value.message


@pytest.mark.parametrize("family", VENDORS)
def test_the_paged_api_names_are_required_with_the_table(family):
    facts = copy.deepcopy(_toml(family))
    facts["library"]["dnn"]["routines"].pop("paged_cache_write")
    with pytest.raises(ConfigError, match=r"\[library.dnn.routines\] is missing the key 'paged_cache_write'"):
        check_facts(facts, f"{family}/vendor.toml")
