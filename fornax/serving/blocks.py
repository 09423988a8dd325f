"""The paged KV cache's block pool: :class:`BlockManager`.

The device KV cache is cut into ``num_blocks`` blocks of ``block_size`` token slots (paged
attention).  A sequence's block table maps its positions onto blocks: position ``p`` lives in
``block_table[p // block_size]``, slot ``p % block_size``.  The manager hands blocks out,
shares them between sequences and takes them back; it never touches their contents — the
model runner reads and writes the slots, and performs the copies :meth:`BlockManager.swap_out`
and :meth:`BlockManager.swap_in` return.

Automatic prefix caching (the policy of vLLM's KV cache manager)
-----------------------------------------------------------------
A block that is *full* and *computed* never changes again, so it is identified by its
contents in context: its hash is ``H(parent hash, its tokens)``, chained from the first block
of the sequence (a block's K/V depend on every token before it, and the chain captures
exactly that).  :meth:`BlockManager.commit` registers each newly full block under its hash;
a later sequence whose prompt starts with the same tokens finds those blocks again
(:meth:`BlockManager.match_prefix`) and shares them (reference count + 1) instead of
computing them.  Only full blocks are ever shared, so no shared block is written to.  At least
one token of a sequence is always left to compute: the step that computes it produces the
logits the next token is sampled from.

Blocks are reference counted.  A block no sequence holds goes to the *tail* of the free
queue; if it is registered it keeps its hash there (cached but evictable), so a prefix can be
found again after every sequence using it finished.  Allocation takes the *head* of the free
queue: the least recently freed block, evicting its hash (LRU).  A sequence's blocks are
freed in reverse table order, so of a freed prefix the head blocks — the ones most likely to
be shared by the next request — are evicted last.  A cached block found by a match while it
sits in the free queue is taken out of the queue.  ``free_blocks`` therefore counts every
allocatable block, cached-but-evictable ones included.

Hashes are SHA-256 digests of the parent digest and the tokens, so a hit is a real match (no
collision handling is needed at this scale).  A hash names at most one block: a second block
computed with the same contents (two sequences prefilled the same prefix in the same step)
is not registered and is simply freed when its sequence releases it.

Swap space
----------
``num_host_blocks`` blocks of host memory hold the K/V of sequences preempted by swapping.
:meth:`BlockManager.swap_out` moves a whole block table to host blocks (each device block,
shared or not, is copied: the host copy is the sequence's own) and releases the device
blocks; :meth:`BlockManager.swap_in` allocates fresh device blocks and releases the host
ones.  The swapped-in blocks are registered again by the next :meth:`BlockManager.commit`.
"""

from __future__ import annotations

import hashlib
import math
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from fornax.layers.errors import ConfigError
from fornax.serving.sequence import Sequence

#: the parent hash of a sequence's first block
ROOT_HASH = b""


def block_hash(parent: bytes, tokens: list[int] | tuple[int, ...]) -> bytes:
    """The prefix-cache key of a full block: SHA-256 of its parent's hash and its tokens."""
    digest = hashlib.sha256(parent)
    digest.update(np.asarray(tokens, dtype="<i8").tobytes())
    return digest.digest()


@dataclass
class _SeqHashes:
    """The manager's memo for one sequence: the hash chain of its full blocks (tokens only
    grow, so it only grows), and how many leading blocks of its table :meth:`commit` has
    already looked at since the table was last emptied."""

    chain: list[bytes] = field(default_factory=list)
    committed: int = 0


class BlockManager:
    """Device KV blocks with reference counting, automatic prefix caching and swap space."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True,
                 num_host_blocks: int = 0):
        for name, value, least in (("num_blocks", num_blocks, 1), ("block_size", block_size, 1),
                                   ("num_host_blocks", num_host_blocks, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"KV cache: {name} must be an integer >= {least}, not {value!r}",
                                  hint="size the cache in blocks of block_size tokens")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = bool(prefix_caching)
        self.num_host_blocks = num_host_blocks
        self._ref = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}
        #: blocks no sequence holds, least recently freed first (insertion order)
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._host_free: deque[int] = deque(range(num_host_blocks))
        self._seqs: weakref.WeakKeyDictionary[Sequence, _SeqHashes] = weakref.WeakKeyDictionary()
        self._prefix_query_tokens = 0
        self._prefix_hit_tokens = 0
        self._evictions = 0
        self._swap_out_blocks = 0
        self._swap_in_blocks = 0

    # ---- occupancy ---------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        """Blocks allocatable now: free ones, cached-but-evictable ones included."""
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        return self.num_blocks - len(self._free)

    @property
    def free_host_blocks(self) -> int:
        return len(self._host_free)

    def utilisation(self) -> float:
        """The fraction of device blocks held by sequences."""
        return self.used_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` positions."""
        return math.ceil(num_tokens / self.block_size)

    # ---- introspection (tests, reports) ---------------------------------------------

    def ref_count(self, block: int) -> int:
        """How many block tables hold device block ``block``."""
        return self._ref[block]

    def hash_of(self, block: int) -> bytes | None:
        """The hash device block ``block`` is registered under in the prefix cache, if any."""
        return self._hash[block]

    def cached_block(self, key: bytes) -> int | None:
        """The device block registered under hash ``key``, if any."""
        return self._cached.get(key)

    def free_queue(self) -> list[int]:
        """The free device blocks in allocation order (least recently freed first)."""
        return list(self._free)

    def chain(self, seq: Sequence, num_blocks: int | None = None) -> list[bytes]:
        """The hash chain of ``seq``'s first ``num_blocks`` full blocks (all of them by
        default)."""
        full = len(seq.tokens) // self.block_size
        want = full if num_blocks is None else min(num_blocks, full)
        memo = self._memo(seq)
        bs = self.block_size
        while len(memo.chain) < want:
            i = len(memo.chain)
            parent = memo.chain[-1] if memo.chain else ROOT_HASH
            memo.chain.append(block_hash(parent, seq.tokens[i * bs:(i + 1) * bs]))
        return memo.chain[:want]

    def _memo(self, seq: Sequence) -> _SeqHashes:
        memo = self._seqs.get(seq)
        if memo is None:
            memo = self._seqs[seq] = _SeqHashes()
        return memo

    # ---- prefix cache ------------------------------------------------------------------

    def lookup(self, seq: Sequence) -> list[int]:
        """The cached blocks :meth:`match_prefix` would attach to ``seq``, changing nothing:
        the longest run of leading full blocks found in the prefix cache, short of covering
        every token (one is always left to compute).  Empty when prefix caching is off."""
        if not self.prefix_caching:
            return []
        limit = (len(seq.tokens) - 1) // self.block_size
        hits = []
        for key in self.chain(seq, limit):
            block = self._cached.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def match_prefix(self, seq: Sequence) -> int:
        """Attach ``seq``'s cached prefix blocks to its (empty) table and return the tokens
        they cover, which become computed; 0 when prefix caching is off."""
        if seq.block_table or seq.num_computed:
            raise ValueError(f"match_prefix needs a sequence with no blocks and nothing computed: {seq!r}")
        if not self.prefix_caching:
            return 0
        self._prefix_query_tokens += len(seq.tokens)
        hits = self.lookup(seq)
        for block in hits:
            if self._ref[block] == 0:
                del self._free[block]
            self._ref[block] += 1
        seq.block_table.extend(hits)
        covered = len(hits) * self.block_size
        self._memo(seq).committed = len(hits)
        seq.num_computed = covered
        seq.prefix_hit_tokens += covered
        self._prefix_hit_tokens += covered
        return covered

    def commit(self, seq: Sequence) -> None:
        """Register every full, computed block of ``seq`` not registered yet in the prefix
        cache, after a step advanced ``seq.num_computed``.  A block whose hash already names
        another block stays unregistered (that other block is the cached copy)."""
        if not self.prefix_caching:
            return
        memo = self._memo(seq)
        full = min(seq.num_computed // self.block_size, len(seq.block_table))
        if full <= memo.committed:
            return
        chain = self.chain(seq, full)
        for i in range(memo.committed, full):
            block = seq.block_table[i]
            key = chain[i]
            if self._hash[block] is None and key not in self._cached:
                self._hash[block] = key
                self._cached[key] = block
        memo.committed = full

    # ---- allocation ----------------------------------------------------------------------

    def blocks_needed(self, seq: Sequence, num_new_tokens: int, hits: list[int] | None = None) -> int:
        """The free blocks :meth:`allocate` would take for ``num_new_tokens`` more tokens.

        With ``hits`` (what :meth:`lookup` returned for a sequence not yet matched), the count
        is for :meth:`match_prefix` followed by :meth:`allocate`: it includes the hit blocks
        that sit in the free queue, which the match takes out of it."""
        if hits is None:
            total = self.blocks_for(seq.num_computed + num_new_tokens)
            return max(0, total - len(seq.block_table))
        taken = sum(1 for b in hits if self._ref[b] == 0)
        total = self.blocks_for(len(hits) * self.block_size + num_new_tokens)
        return taken + max(0, total - len(hits))

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow ``seq``'s table to hold positions up to ``num_computed + num_new_tokens - 1``;
        False, with nothing changed, when too few blocks are free."""
        need = self.blocks_needed(seq, num_new_tokens)
        if need > len(self._free):
            return False
        for _ in range(need):
            seq.block_table.append(self._take())
        return True

    def _take(self) -> int:
        """The least recently freed block, its cached hash (if any) evicted, ref count 1."""
        block, _ = self._free.popitem(last=False)
        key = self._hash[block]
        if key is not None:
            del self._cached[key]
            self._hash[block] = None
            self._evictions += 1
        self._ref[block] = 1
        return block

    def _release(self, table: list[int]) -> None:
        for block in reversed(table):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None
            elif self._ref[block] < 0:
                raise RuntimeError(f"block {block} released more often than it was taken")

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references to its device blocks (and host blocks, if swapped); the
        table is emptied.  ``num_computed`` is left to the caller."""
        self._release(seq.block_table)
        seq.block_table.clear()
        self._memo(seq).committed = 0
        self._host_free.extend(seq.host_blocks)
        seq.host_blocks.clear()

    # ---- swap space --------------------------------------------------------------------

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]] | None:
        """Move ``seq``'s K/V to host blocks: the (device block, host block) copies to make,
        in table order; the device blocks are released.  None, with nothing changed, when the
        host has too few free blocks."""
        if seq.host_blocks:
            raise ValueError(f"swap_out of a sequence already swapped out: {seq!r}")
        n = len(seq.block_table)
        if n > len(self._host_free):
            return None
        host = [self._host_free.popleft() for _ in range(n)]
        pairs = list(zip(seq.block_table, host))
        self._release(seq.block_table)
        seq.block_table.clear()
        self._memo(seq).committed = 0
        seq.host_blocks.extend(host)
        self._swap_out_blocks += n
        return pairs

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]] | None:
        """Bring ``seq``'s K/V back: the (host block, device block) copies to make, into
        freshly allocated device blocks; the host blocks are released.  None, with nothing
        changed, when too few device blocks are free."""
        if seq.block_table:
            raise ValueError(f"swap_in of a sequence that holds device blocks: {seq!r}")
        n = len(seq.host_blocks)
        if n > len(self._free):
            return None
        device = [self._take() for _ in range(n)]
        pairs = list(zip(seq.host_blocks, device))
        self._host_free.extend(seq.host_blocks)
        seq.host_blocks.clear()
        seq.block_table.extend(device)
        self._swap_in_blocks += n
        return pairs

    # ---- statistics --------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """``prefix_query_tokens`` (tokens of sequences looked up by :meth:`match_prefix`),
        ``prefix_hit_tokens`` (of those, found cached), ``evictions`` (cached blocks reused
        for other contents), ``swap_out_blocks`` / ``swap_in_blocks`` (blocks copied)."""
        return {
            "prefix_query_tokens": self._prefix_query_tokens,
            "prefix_hit_tokens": self._prefix_hit_tokens,
            "evictions": self._evictions,
            "swap_out_blocks": self._swap_out_blocks,
            "swap_in_blocks": self._swap_in_blocks,
        }


__all__ = ["ROOT_HASH", "BlockManager", "block_hash"]
