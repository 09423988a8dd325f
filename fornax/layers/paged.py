"""Paged KV-cache routines for LLM serving (vLLM-style), shared by every family.

:class:`PagedRoutines` builds on :class:`~fornax.layers.dnn.DnnRoutines` (the DNN
library's facts, image packing, module cache and call records) and is mixed into
:class:`~fornax.layers.library.LibraryBase`.  A serving runtime keeps keys and values in
a pool of fixed-size blocks, ``key_cache`` / ``value_cache`` of
``[num_blocks, block_size, kv_heads, head_dim]``, and two routines work on it:

* :meth:`~PagedRoutines.paged_cache_write` stores each new token's K and V rows at its
  slot (``slot // block_size`` is the block, ``slot % block_size`` the row); a negative
  slot is padding and is skipped;
* :meth:`~PagedRoutines.paged_attention` runs causal attention of packed query rows
  (decode steps of one row and prefill chunks of several, in one launch) over each
  sequence's cached context, found through its block table.

Both validate their sizes against the family's ``[library.dnn.paged_attention]`` table
(head dims, block sizes) and ``[library.dnn] dtypes``, build their kernels with
:mod:`fornax.layers.codegen_paged` (specialised for the geometry, cached), and record
the call under the family's API name (``[library.dnn.routines]``).  The kernels read
their addresses from device memory, so they carry no static cost estimate: on a
shape-only (meta) device the routines raise a :class:`~fornax.layers.errors.LibraryError`
before launching anything.
"""

from __future__ import annotations

import math
from typing import Any

from . import codegen_paged as cgp
from .call_record import CallRecord
from .dnn import DnnRoutines, _tag
from .kernel_builder import next_pow2
from .runtime import Stream
from .tiling import choose_gemm_tile


class PagedRoutines(DnnRoutines):
    """Paged KV-cache write and paged attention on a library (mixin for LibraryBase)."""

    # -- shared checks ----------------------------------------------------------------------
    def _paged_facts(self, routine: str) -> dict[str, Any]:
        """The family's ``[library.dnn.paged_attention]`` table; a LibraryError when it (or the
        routine's API name) is missing."""
        facts: dict[str, Any] | None = self.dnn.get("paged_attention")
        if facts is None or routine not in self.dnn.get("routines", {}):
            raise self._error(f"{routine}: {self.name} has no paged KV-cache routines (no "
                              "[library.dnn.paged_attention] table or no API name in "
                              "[library.dnn.routines])",
                              hint="use a family whose vendor.toml declares them")
        return facts

    def _paged_sizes(self, routine: str, params: dict[str, Any], *names: str) -> dict[str, int]:
        """The named sizes of ``params``, each checked to be a positive int."""
        missing = [n for n in names if n not in params]
        if missing:
            raise self._error(f"{routine}: missing size(s) {', '.join(map(repr, missing))} "
                              f"(needs {', '.join(names)})")
        return dict(zip(names, self._positive(routine, **{n: params[n] for n in names})))

    def _paged_geometry(self, routine: str, facts: dict[str, Any], head_dim: int,
                        block_size: int) -> None:
        """Refuse a head dim or block size outside the family's table."""
        if head_dim not in facts["head_dims"]:
            raise self._error(f"{routine}: head dim {head_dim} is not supported by {self.name} "
                              f"(supported: {', '.join(map(str, facts['head_dims']))})",
                              hint="pad the head dim to a supported size")
        if block_size not in facts["block_sizes"]:
            raise self._error(f"{routine}: block size {block_size} is not supported by {self.name} "
                              f"(supported: {', '.join(map(str, facts['block_sizes']))})",
                              hint="allocate the KV cache in one of the supported block sizes")

    def _data_device(self, routine: str) -> None:
        """Refuse a shape-only (meta) device: the kernels' work depends on device data."""
        dev = self.runtime.current_device()
        if self.runtime.driver.devices[dev].meta:
            raise self._error(f"{routine}: device {dev} is shape-only (meta), and this routine's "
                              "kernel reads its addresses from device memory (slots, block tables, "
                              "sequence lengths), so it has no static cost estimate to price it by",
                              hint="run paged KV-cache routines on a data-mode stack (meta = false)")

    # -- the routines -------------------------------------------------------------------------
    def paged_cache_write(self, k: int, v: int, key_cache: int, value_cache: int, slots: int,
                          params: dict[str, Any], stream: Stream | None = None) -> CallRecord:
        """vLLM's ``reshape_and_cache``: for every token ``t`` with ``slots[t] >= 0``,
        ``key_cache[slots[t] // block_size, slots[t] % block_size] = k[t]`` (all kv heads), and
        the same for ``v``.  k, v: ``[num_tokens, kv_heads, head_dim]``; slots: int64
        ``[num_tokens]``; caches ``[num_blocks, block_size, kv_heads, head_dim]``.  A negative
        slot, or one at or past ``num_blocks * block_size``, skips its token.  ``params``:
        num_tokens, num_blocks, block_size, kv_heads, head_dim, dtype."""
        routine = "paged_cache_write"
        facts = self._paged_facts(routine)
        dtype = self._dnn_dtype(routine, params)
        p = self._paged_sizes(routine, params, "num_tokens", "num_blocks", "block_size",
                              "kv_heads", "head_dim")
        self._paged_geometry(routine, facts, p["head_dim"], p["block_size"])
        self._data_device(routine)
        kvh, d = p["kv_heads"], p["head_dim"]
        name = f"{self.name}_paged_cache_write_{dtype}_kv{kvh}_d{d}"
        module, image = self._dnn_module(("paged", name), lambda: [
            cgp.paged_cache_write_kernel(name, dtype, kvh, d, self.group_size)])
        num_slots = p["num_blocks"] * p["block_size"]
        self.runtime.launch(module, name, (p["num_tokens"], 1, 1),
                            {"k": k, "v": v, "key_cache": key_cache, "value_cache": value_cache,
                             "slots": slots, "num_slots": num_slots}, stream)
        return self._record(routine, self.dnn["row_algorithm"],
                            f"one work-group per token ({p['num_tokens']}), its {kvh}x{d} K and V "
                            f"rows ({next_pow2(kvh * d)} lanes) stored at the slot it reads; negative "
                            f"slots (padding) skipped; {p['num_blocks']} block(s) of "
                            f"{p['block_size']} slots",
                            image, (p["num_tokens"], p["num_blocks"], p["block_size"], kvh, d))

    def paged_attention(self, q: int, key_cache: int, value_cache: int, block_tables: int,
                        seq_lens: int, query_start: int, o: int, params: dict[str, Any],
                        stream: Stream | None = None) -> CallRecord:
        """Causal attention of packed queries over a paged K/V cache (decode and prefill
        chunks in one launch).  q, o: ``[num_tokens, heads, head_dim]``; sequence ``s`` owns
        query rows ``query_start[s] .. query_start[s+1]-1`` (int32 ``[num_seqs + 1]``);
        ``seq_lens`` (int32 ``[num_seqs]``) counts its context including those queries;
        ``block_tables`` (int32 ``[num_seqs, max_blocks]``) maps its logical blocks to
        physical ones.  Query row ``i`` of ``s`` sits at position ``seq_lens[s] - q_len + i``
        and sees keys ``0..position``; query head ``h`` reads kv head
        ``h // (heads // kv_heads)``.  ``params``: num_seqs, num_tokens, max_query_len,
        max_blocks, heads, kv_heads, head_dim, block_size, scale (1/sqrt(head_dim)), dtype."""
        routine = "paged_attention"
        facts = self._paged_facts(routine)
        dtype = self._dnn_dtype(routine, params)
        p = self._paged_sizes(routine, params, "num_seqs", "num_tokens", "max_query_len",
                              "max_blocks", "heads", "kv_heads", "head_dim", "block_size")
        h, kvh, d, bs = p["heads"], p["kv_heads"], p["head_dim"], p["block_size"]
        if h % kvh:
            raise self._error(f"{routine}: heads={h} is not a multiple of kv_heads={kvh} "
                              "(grouped-query attention shares each kv head among "
                              "heads // kv_heads query heads)",
                              hint="use a kv_heads that divides heads")
        self._paged_geometry(routine, facts, d, bs)
        lq, seqs, mb = p["max_query_len"], p["num_seqs"], p["max_blocks"]
        if lq > p["num_tokens"]:
            raise self._error(f"{routine}: max_query_len={lq} exceeds num_tokens={p['num_tokens']} "
                              "(no sequence can own more query rows than there are)")
        scale = params.get("scale", 1.0 / math.sqrt(d))
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise self._error(f"{routine}: scale must be a finite number, got {scale!r}")
        scale = float(scale)
        item = 2 if dtype in ("float16", "bfloat16") else 4
        fits = [t for t in facts["tiles"]
                if self._fits(cgp.paged_attention_shared_bytes(min(t["rows"], next_pow2(lq)), bs, d, item))]
        if not fits:
            raise self._error(f"{routine}: no query tile for head dim {d} and block size {bs} "
                              f"({dtype}) fits the device's shared memory",
                              hint="use a smaller block size or head dim")
        self._data_device(routine)
        # instances run over (query tiles, sequences, heads): the shared GEMM tile rule picks
        # the largest query tile that still fills the device
        i, why = choose_gemm_tile(lq, d, seqs * h, self._units(), [(t["rows"], d, bs) for t in fits])
        algo = fits[i]
        bm = min(algo["rows"], next_pow2(lq))
        name = (f"{self.name}_paged_attn_{dtype}_h{h}kv{kvh}_d{d}_b{bs}x{mb}_q{bm}_"
                f"{_tag({'scale': scale})}")
        module, image = self._dnn_module(("paged", name), lambda: [
            cgp.paged_attention_kernel(name, dtype, h, kvh, d, bs, mb, bm, scale, self.group_size)])
        self.runtime.launch(module, name, (math.ceil(lq / bm), seqs, h),
                            {"q": q, "key_cache": key_cache, "value_cache": value_cache,
                             "block_tables": block_tables, "seq_lens": seq_lens,
                             "query_start": query_start, "o": o}, stream)
        rows = ("one query row per instance (decode)" if bm == 1 else
                f"{bm} query rows per instance (max_query_len {lq})")
        gqa = f"{h // kvh} query heads per kv head" if kvh != h else "one kv head per query head"
        return self._record(routine, algo["name"],
                            f"{rows}; online softmax over up to {mb} K/V block(s) of {bs} slots "
                            f"read through the block table, causal; {gqa}; {why}",
                            image, (seqs, p["num_tokens"], lq, mb, h, kvh, d, bs))
