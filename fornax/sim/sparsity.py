"""The 2:4 structured-sparse operand format of the device's sparse matrix instruction.

A 2:4-sparse ``[M, K]`` matrix keeps at most two nonzeros in every group of four
consecutive elements along K.  Compressed, it is two arrays:

* **values** ``[M, K/2]`` in the matrix's dtype: the two kept elements of every group, in K
  order (a group with fewer than two nonzeros keeps zeros in their place);
* **metadata** ``[M, ceil(K/32)]`` int32 words: a 2-bit position (0..3 inside its group) per
  kept value, 16 per word, kept value ``j`` of a row in bits ``2 (j % 16)`` and
  ``2 (j % 16) + 1`` of word ``j // 16``.

That is the information the real 16-bit format stores (half the values plus two bits per
kept value: a quarter of the dense bytes is saved less the metadata's sixteenth); the real
libraries also reorder values and metadata into the tensor cores' register layout, which
is opaque to callers and not reproduced here.  :class:`~fornax.sim.isa.SparseDot` executes
on exactly these two arrays (through :func:`expand`); the other functions are the host-side
reference of pruning, the pattern check and compression, which the libraries' device
kernels (``fornax.layers.sparse_compress``) are held to bit for bit.
"""

from __future__ import annotations

import numpy as np

from .isa import SPARSE_K_PER_WORD, SPARSE_VALUES_PER_WORD

#: elements of a group, and how many of them a 2:4 matrix may keep
GROUP = 4
KEPT = 2


def metadata_words(k: int) -> int:
    """Metadata words per row of a ``K``-column matrix."""
    return -(-k // SPARSE_K_PER_WORD)


def compressed_bytes(m: int, k: int, itemsize: int) -> tuple[int, int]:
    """(values bytes, metadata bytes) of a compressed ``[m, k]`` matrix of ``itemsize``-byte
    elements; K must be a multiple of 4."""
    return m * (k // 2) * itemsize, m * metadata_words(k) * 4


def positions(words: np.ndarray, kept: int) -> np.ndarray:
    """The 2-bit positions of ``kept`` values per row from ``[..., W]`` int32 metadata words."""
    j = np.arange(kept)
    w = words[..., j // SPARSE_VALUES_PER_WORD].astype(np.int64) & 0xFFFFFFFF
    return ((w >> (2 * (j % SPARSE_VALUES_PER_WORD))) & 3).astype(np.int64)


def expand(values: np.ndarray, words: np.ndarray, k: int) -> np.ndarray:
    """The dense ``[..., M, k]`` matrix of compressed ``values`` ``[..., M, k/2]`` and metadata
    ``words``: each kept value at ``4 (j // 2) + position``, zeros elsewhere (a position
    named twice in one group keeps the later value)."""
    kept = values.shape[-1]
    cols = 4 * (np.arange(kept) // 2) + positions(words, kept)
    lead = np.broadcast_shapes(values.shape[:-1], cols.shape[:-1])
    dense = np.zeros(lead + (k,), dtype=values.dtype)
    np.put_along_axis(dense, np.broadcast_to(cols, lead + (kept,)),
                      np.broadcast_to(values, lead + (kept,)), axis=-1)
    return dense


def violations(dense: np.ndarray) -> int:
    """Groups of four along the last axis holding more than two nonzeros (0: the matrix is
    2:4-sparse); the last axis must be a multiple of 4."""
    groups = dense.reshape(dense.shape[:-1] + (-1, GROUP))
    return int(np.count_nonzero(np.count_nonzero(groups, axis=-1) > KEPT))


def prune_mask(dense: np.ndarray) -> np.ndarray:
    """Which elements a magnitude prune keeps: the two largest ``|x|`` of every group of four
    along the last axis (the first of equal magnitudes wins), as ``cusparseLtSpMMAPrune``'s
    TILE/STRIP algorithms keep the largest two per group."""
    groups = np.abs(dense.astype(np.float64)).reshape(dense.shape[:-1] + (-1, GROUP))
    # a stable sort by decreasing magnitude: the first two positions are kept
    order = np.argsort(-groups, axis=-1, kind="stable")
    keep = np.zeros(groups.shape, dtype=bool)
    np.put_along_axis(keep, order[..., :KEPT], True, axis=-1)
    return keep.reshape(dense.shape)


def compress(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, metadata words) of a 2:4-sparse ``[M, K]`` matrix (K a multiple of 4).  A
    group with fewer than two nonzeros keeps its first zero positions after its nonzeros'
    (every kept slot names a distinct position, so expansion is exact)."""
    m, k = dense.shape
    groups = dense.reshape(m, k // GROUP, GROUP)
    # the kept slots: nonzeros first (in position order), then the earliest zeros
    rank = np.argsort(groups == 0, axis=-1, kind="stable")[..., :KEPT]
    pos = np.sort(rank, axis=-1)                                   # K order inside the group
    values = np.take_along_axis(groups, pos, axis=-1).reshape(m, k // 2)
    flat = pos.reshape(m, k // 2).astype(np.int64)
    nwords = metadata_words(k)
    padded = np.zeros((m, nwords * SPARSE_VALUES_PER_WORD), dtype=np.int64)
    padded[:, : k // 2] = flat
    shifts = 2 * np.arange(SPARSE_VALUES_PER_WORD, dtype=np.int64)
    words = (padded.reshape(m, nwords, SPARSE_VALUES_PER_WORD) << shifts).sum(axis=-1)
    return values, words.astype(np.uint32).view(np.int32)

