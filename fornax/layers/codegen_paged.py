"""Kernel generators for the paged KV-cache routines (:mod:`fornax.layers.paged`).

A serving runtime keeps the keys and values of every running sequence in one pool of
fixed-size blocks (vLLM's paged KV cache): ``key_cache`` and ``value_cache`` are
``[num_blocks, block_size, kv_heads, head_dim]``, and a sequence's block table maps its
logical block ``p // block_size`` to a physical block of the pool.  Two kernels work on it,
each specialised for its geometry (sizes baked in as constants) and generic over the
number of tokens and sequences (a grid axis):

* **cache write** (:func:`paged_cache_write_kernel`, vLLM's ``reshape_and_cache``): one
  program instance per token, one lane per (kv head, dim) element of its row.  The
  instance loads the token's slot (int64) and stores its K and V rows at
  ``slot * kv_heads * head_dim`` of the caches (slot ``s`` is block ``s // block_size``,
  row ``s % block_size``, and the blocks are contiguous, so the row offset is linear in
  the slot).  A negative slot (padding) or one at or past the cache's ``num_slots``
  switches the instance's lanes off: nothing is read or written for that token;
* **paged attention** (:func:`paged_attention_kernel`): grid (query tiles of
  ``max_query_len``, sequences, heads).  Each instance loads its sequence's
  ``query_start`` and ``seq_len`` (scalar loads: the rows it owns and the context it
  sees are data), its query tile, then loops over the ``max_blocks`` entries of the
  block table (a static bound): it loads the physical block id (a data-dependent
  offset; the load is masked off for blocks past the sequence's length) and the K and
  V tiles of that block for its kv head (grouped-query attention: query head ``h``
  reads kv head ``h // (heads // kv_heads)``), and keeps the running row max, row sum
  and float32 output accumulator of the online softmax exactly as the flash kernel of
  :func:`fornax.layers.codegen_dnn.attention_fwd_kernel` does (probabilities converted
  to the storage dtype before the second product).  Query row ``i`` of a sequence sits
  at position ``seq_len - q_len + i`` and sees keys ``0..position`` (causal); keys at
  or past ``seq_len`` are masked, and rows at or past ``q_len`` are computed but not
  stored.

Both kernels read addresses from device memory (slots, block tables, query starts and
sequence lengths decide which lanes load and store), so the work they count depends on
data a code generator never sees: they carry no cost estimate (``meta["estimate"]``),
and :mod:`fornax.layers.paged` refuses to launch them on a shape-only device.
"""

from __future__ import annotations

from ..sim import isa
from .codegen_dnn import NEG_BIG, _loop, _lt, _meta, attention_shared_bytes
from .kernel_builder import KernelBuilder, next_pow2


def paged_attention_shared_bytes(bm: int, block_size: int, d: int, itemsize: int) -> int:
    """Shared memory one instance's tiles take: the query tile and one block of K and V."""
    return attention_shared_bytes(bm, block_size, d, itemsize)


def _load_i64(kb: KernelBuilder, ptr: str, off: str, mask: str | None = None) -> str:
    """Load an integer from ``ptr`` at ``off`` (under ``mask``) and widen it to int64."""
    return kb.emit(isa.Convert(kb.reg(), kb.emit(isa.Load(kb.reg(), ptr, off, mask)), "int64"))


def paged_attention_kernel(name: str, dtype: str, heads: int, kv_heads: int, d: int,
                           block_size: int, max_blocks: int, bm: int, scale: float,
                           group_size: int) -> isa.Program:
    """o = softmax(scale * q k^T, causal over each sequence's context) v over a paged cache.

    Parameters: q, key_cache, value_cache, block_tables (int32 [num_seqs, max_blocks]),
    seq_lens (int32 [num_seqs]), query_start (int32 [num_seqs + 1]), o.  Grid:
    (ceil(max_query_len / bm), num_seqs, heads)."""
    kb = KernelBuilder(name)
    f32, i64 = "float32", "int64"
    pq = kb.param("q", "ptr", dtype)
    pk, pv = kb.param("key_cache", "ptr", dtype), kb.param("value_cache", "ptr", dtype)
    pbt = kb.param("block_tables", "ptr", "int32")
    psl = kb.param("seq_lens", "ptr", "int32")
    pqs = kb.param("query_start", "ptr", "int32")
    po = kb.param("o", "ptr", dtype)
    B = block_size
    row_elems = kv_heads * d                   # elements of one cache row (one token slot)
    qt, seq, head = kb.pid(0), kb.pid(1), kb.pid(2)
    # the sequence's rows and context: data, loaded once per instance
    q0 = _load_i64(kb, pqs, seq)
    q_len = kb.binary("sub", _load_i64(kb, pqs, kb.iadd(seq, kb.const(1, i64))), q0)
    seq_len = _load_i64(kb, psl, seq)
    first = kb.binary("sub", seq_len, q_len)   # position of the sequence's first query row
    rows = kb.emit(isa.Reshape(kb.reg(), kb.iadd(kb.imul(qt, bm), kb.arange(bm)), (bm, 1)))
    row_ok = kb.binary("lt", rows, q_len)                                       # [bm, 1]
    pos = kb.binary("add", first, rows)                                         # [bm, 1]
    dcol = kb.emit(isa.Reshape(kb.reg(), kb.arange(d), (1, d)))                 # [1, d]
    drow = kb.emit(isa.Reshape(kb.reg(), dcol, (d, 1)))                         # [d, 1]
    qo_off = kb.binary("add", kb.imul(kb.iadd(kb.imul(kb.binary("add", q0, rows), heads), head), d),
                       dcol)                                                    # [bm, d]
    q = kb.emit(isa.Load(kb.reg(), pq, qo_off, row_ok))
    group = heads // kv_heads
    kvh = head if group == 1 else kb.binary("floordiv", head, kb.const(group, i64))
    head_off = kb.imul(kvh, d)
    slot_row = kb.emit(isa.Reshape(kb.reg(), kb.arange(B), (1, B)))             # [1, B]
    slot_col = kb.emit(isa.Reshape(kb.reg(), slot_row, (B, 1)))                 # [B, 1]
    kt_rel = kb.binary("add", kb.binary("add", head_off, kb.imul(slot_row, row_elems)), drow)  # [d, B]
    v_rel = kb.binary("add", kb.binary("add", head_off, kb.imul(slot_col, row_elems)), dcol)   # [B, d]
    bt_base = kb.imul(seq, max_blocks)
    m = kb.emit(isa.Broadcast(kb.reg(), kb.const(NEG_BIG, f32), (bm, 1)))
    lsum = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, f32), (bm, 1)))
    acc = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, f32), (bm, d)))
    var = "%blk"
    start = len(kb.body)
    p0 = kb.imul(var, B)                                       # first position of the block
    used = kb.binary("lt", p0, seq_len)                        # the block holds context
    phys = _load_i64(kb, pbt, kb.binary("add", bt_base, var), used)
    base = kb.imul(phys, B * row_elems)                        # the physical block's first element
    cols = kb.binary("add", slot_row, p0)                      # positions of its rows [1, B]
    col_ok = kb.binary("lt", cols, seq_len)
    kt = kb.emit(isa.Load(kb.reg(), pk, kb.binary("add", base, kt_rel), col_ok))          # [d, B]
    s = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, f32), (bm, B)))
    s = kb.emit(isa.Dot(kb.reg(), q, kt, s, f32))
    s = kb.binary("mul", s, kb.const(float(scale), f32))
    ok = kb.binary("and", col_ok, kb.binary("le", cols, pos))                           # [bm, B]
    s = kb.emit(isa.Where(kb.reg(), ok, s, kb.const(NEG_BIG, f32)))
    m_new = kb.binary("max", m, kb.emit(isa.Reduce(kb.reg(), "max", s, -1)))
    p = kb.unary("exp", kb.binary("sub", s, m_new))
    alpha = kb.unary("exp", kb.binary("sub", m, m_new))
    kb.emit(isa.Binary(lsum, "add", kb.binary("mul", lsum, alpha),
                       kb.emit(isa.Reduce(kb.reg(), "sum", p, -1))))
    v_ok = kb.emit(isa.Reshape(kb.reg(), col_ok, (B, 1)))
    vt = kb.emit(isa.Load(kb.reg(), pv, kb.binary("add", base, v_rel), v_ok))            # [B, d]
    kb.emit(isa.Dot(acc, kb.emit(isa.Convert(kb.reg(), p, dtype)), vt, kb.binary("mul", acc, alpha), f32))
    kb.emit(isa.Unary(m, "neg", kb.unary("neg", m_new)))        # m = m_new (a register copy)
    _loop(kb, var, 0, max_blocks, 1, start)
    o = kb.emit(isa.Convert(kb.reg(), kb.binary("div", acc, lsum), dtype))
    kb.emit(isa.Store(po, qo_off, o, row_ok))
    item = isa.np_dtype(dtype).itemsize
    return kb.program(**_meta(group_size, "paged_attention",
                              paged_attention_shared_bytes(bm, B, d, item), bm * d + bm * B,
                              tile=[bm, B], head_dim=d, block_size=B))


def paged_cache_write_kernel(name: str, dtype: str, kv_heads: int, d: int,
                             group_size: int) -> isa.Program:
    """key_cache / value_cache rows at each token's slot = its k / v rows.

    Parameters: k, v ([num_tokens, kv_heads, d]), key_cache, value_cache, slots (int64
    [num_tokens]) and the scalar num_slots (num_blocks * block_size).  Grid: (num_tokens, 1, 1)."""
    kb = KernelBuilder(name)
    pk, pv = kb.param("k", "ptr", dtype), kb.param("v", "ptr", dtype)
    pkc, pvc = kb.param("key_cache", "ptr", dtype), kb.param("value_cache", "ptr", dtype)
    pslots = kb.param("slots", "ptr", "int64")
    kb.param("num_slots", "scalar", "int64")
    row = kv_heads * d
    width = next_pow2(row)
    tok = kb.pid(0)
    col = kb.arange(width)
    slot = kb.emit(isa.Load(kb.reg(), pslots, tok))
    ok = kb.binary("and", kb.binary("ge", slot, kb.const(0, "int64")),
                   kb.binary("lt", slot, kb.emit(isa.ScalarArg(kb.reg(), "num_slots"))))
    mask = ok if width == row else kb.binary("and", ok, _lt(kb, col, row))
    src = kb.binary("add", kb.imul(tok, row), col)
    dst = kb.binary("add", kb.imul(slot, row), col)
    for ptr, cache in ((pk, pkc), (pv, pvc)):
        kb.emit(isa.Store(cache, dst, kb.emit(isa.Load(kb.reg(), ptr, src, mask)), mask))
    return kb.program(**_meta(group_size, "paged_cache_write", 0, 2 * width, width=width))
