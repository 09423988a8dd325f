"""The KV block pool: reference counting, automatic prefix caching, LRU eviction, swap space.

The property test at the end drives random operations against a model of the device's and
the host's block contents: every position a sequence has computed must hold that sequence's
token, whoever else shares the block, whatever was evicted or swapped in between.
"""

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fornax.layers.errors import ConfigError
from fornax.serving.blocks import BlockManager
from fornax.serving.requests import Request
from fornax.serving.sequence import Sequence

BS = 4


def seq(name, tokens, max_new=4):
    return Sequence(Request(name, tuple(tokens), max_new))


def compute_all(bm, s):
    """Prefill ``s`` completely (prefix hits first), as the scheduler would."""
    bm.match_prefix(s)
    assert bm.allocate(s, s.num_tokens - s.num_computed)
    s.num_computed = s.num_tokens
    bm.commit(s)


def check_refcounts(bm, seqs):
    held = {}
    for s in seqs:
        for b in s.block_table:
            held[b] = held.get(b, 0) + 1
    for b in range(bm.num_blocks):
        assert bm.ref_count(b) == held.get(b, 0)
    assert bm.free_blocks + bm.used_blocks == bm.num_blocks
    assert set(bm.free_queue()) == {b for b in range(bm.num_blocks) if held.get(b, 0) == 0}


def test_bad_sizes():
    for kwargs in ({"num_blocks": 0, "block_size": 4}, {"num_blocks": 4, "block_size": 0},
                   {"num_blocks": 4, "block_size": 4, "num_host_blocks": -1}):
        with pytest.raises(ConfigError):
            BlockManager(**kwargs)


def test_allocate_counts_and_fails_cleanly():
    bm = BlockManager(num_blocks=4, block_size=BS)
    s = seq("a", range(10, 20))
    assert bm.blocks_needed(s, 10) == 3
    assert bm.match_prefix(s) == 0
    assert bm.allocate(s, 10) and len(s.block_table) == 3
    assert bm.used_blocks == 3 and bm.free_blocks == 1 and bm.utilisation() == 0.75
    s.num_computed = 10
    assert bm.blocks_needed(s, 2) == 0            # positions 10, 11 fit the third block
    assert bm.blocks_needed(s, 3) == 1
    other = seq("b", range(30, 40))
    before = (list(other.block_table), bm.free_queue())
    assert not bm.allocate(other, 10)             # needs 3, 1 free
    assert (other.block_table, bm.free_queue()) == before
    assert bm.allocate(s, 3) and bm.free_blocks == 0
    bm.free(s)
    assert s.block_table == [] and bm.free_blocks == 4 and bm.used_blocks == 0


def test_prefix_sharing_hits_evicts():
    bm = BlockManager(num_blocks=8, block_size=BS)
    prefix = list(range(100, 108))                # two full blocks
    a = seq("a", prefix + [1, 2, 3])
    b = seq("b", prefix + [7, 7, 7, 7, 7])
    compute_all(bm, a)
    assert a.prefix_hit_tokens == 0
    assert bm.match_prefix(b) == 8
    assert b.block_table == a.block_table[:2]     # the same device blocks
    assert b.num_computed == 8 and b.prefix_hit_tokens == 8
    assert [bm.ref_count(x) for x in a.block_table] == [2, 2, 1]
    assert bm.allocate(b, b.num_tokens - 8)
    b.num_computed = b.num_tokens
    bm.commit(b)
    assert b.block_table[2] != a.block_table[2]
    check_refcounts(bm, [a, b])

    # both finish: their blocks are free but the prefix stays cached (evictable)
    shared = a.block_table[:2]
    bm.free(a)
    bm.free(b)
    assert bm.used_blocks == 0 and bm.free_blocks == 8
    c = seq("c", prefix + [5])
    assert bm.match_prefix(c) == 8 and c.block_table == shared
    assert bm.free_blocks == 6                    # the hits left the free queue
    assert all(x not in bm.free_queue() for x in shared)
    bm.free(c)

    # cycle the whole pool through other contents: every cached block is evicted
    filler = seq("f", range(200, 232))            # 8 blocks
    compute_all(bm, filler)
    assert bm.counts()["evictions"] >= 3          # a's two prefix blocks and tails
    bm.free(filler)
    d = seq("d", prefix + [5])
    assert bm.match_prefix(d) == 0 and d.block_table == []
    assert bm.counts()["prefix_hit_tokens"] == 16


def test_a_hit_never_covers_every_token():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = seq("a", range(50, 58))                   # exactly two blocks
    compute_all(bm, a)
    again = seq("again", range(50, 58))
    assert bm.lookup(again) == a.block_table[:1]
    assert bm.match_prefix(again) == 4            # the last block is recomputed
    one_block = seq("one", range(50, 54))
    assert bm.match_prefix(one_block) == 0
    longer = seq("longer", range(50, 59))
    assert bm.match_prefix(longer) == 8


def test_hash_chain_depends_on_the_whole_prefix():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = seq("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    compute_all(bm, a)
    # the same second block after a different first block is not a hit
    b = seq("b", [0, 2, 3, 4, 5, 6, 7, 8, 9])
    assert bm.match_prefix(b) == 0
    # a matching first block alone is
    c = seq("c", [1, 2, 3, 4, 0, 6, 7, 8, 9])
    assert bm.match_prefix(c) == 4


def test_only_full_computed_blocks_are_cached():
    bm = BlockManager(num_blocks=8, block_size=BS)
    a = seq("a", range(60, 70))
    assert bm.allocate(a, 10)
    a.num_computed = 6                            # one full block computed, one half
    bm.commit(a)
    assert bm.hash_of(a.block_table[0]) is not None
    assert bm.hash_of(a.block_table[1]) is None and bm.hash_of(a.block_table[2]) is None
    b = seq("b", range(60, 70))
    assert bm.match_prefix(b) == 4
    bm.free(b)
    a.num_computed = 10
    bm.commit(a)
    assert bm.hash_of(a.block_table[1]) is not None and bm.hash_of(a.block_table[2]) is None
    c = seq("c", range(60, 70))
    assert bm.match_prefix(c) == 8


def test_prefix_caching_off():
    bm = BlockManager(num_blocks=8, block_size=BS, prefix_caching=False)
    a = seq("a", range(10))
    compute_all(bm, a)
    assert all(bm.hash_of(x) is None for x in a.block_table)
    assert bm.match_prefix(seq("b", range(10))) == 0
    assert bm.counts()["prefix_query_tokens"] == 0


def test_lru_order():
    bm = BlockManager(num_blocks=6, block_size=BS)
    assert bm.free_queue() == [0, 1, 2, 3, 4, 5]
    a = seq("a", range(100, 112))                 # 3 blocks: 0 1 2
    b = seq("b", range(200, 208))                 # 2 blocks: 3 4
    compute_all(bm, a)
    compute_all(bm, b)
    assert a.block_table == [0, 1, 2] and b.block_table == [3, 4]
    bm.free(b)                                    # freed in reverse table order
    bm.free(a)
    assert bm.free_queue() == [5, 4, 3, 2, 1, 0]
    # allocation takes the least recently freed first: the never-used block, then b's tail
    c = seq("c", range(300, 312))
    compute_all(bm, c)
    assert c.block_table == [5, 4, 3]
    assert bm.counts()["evictions"] == 2          # 4 and 3 held b's cached blocks
    assert bm.match_prefix(seq("b2", range(200, 209))) == 0   # b's prefix is gone
    # a's prefix head (block 0) was freed last, so it survives longest
    d = seq("d", range(100, 112))
    assert bm.lookup(d) == [0, 1]
    # a hit taken out of the middle of the free queue keeps the others' order
    e = seq("e", list(range(100, 104)) + [9])
    assert bm.match_prefix(e) == 4
    assert bm.free_queue() == [2, 1]


def test_swap_out_and_in():
    bm = BlockManager(num_blocks=6, block_size=BS, num_host_blocks=4)
    a = seq("a", range(100, 110))                 # 3 blocks
    compute_all(bm, a)
    table = list(a.block_table)
    pairs = bm.swap_out(a)
    assert pairs == list(zip(table, [0, 1, 2]))
    assert a.block_table == [] and a.host_blocks == [0, 1, 2]
    assert bm.used_blocks == 0 and bm.free_host_blocks == 1
    assert a.num_computed == 10                   # the K/V live on in host memory
    # not enough host room: nothing changes
    b = seq("b", range(300, 310))
    compute_all(bm, b)
    b_table = list(b.block_table)
    assert bm.swap_out(b) is None and b.block_table == b_table and b.host_blocks == []
    # not enough device room to swap a back in: b holds 3 blocks, hog 1, a needs 3
    hog = seq("hog", range(400, 404))
    compute_all(bm, hog)
    assert bm.free_blocks == 2
    assert bm.swap_in(a) is None and a.host_blocks == [0, 1, 2] and a.block_table == []
    bm.free(hog)
    back = bm.swap_in(a)
    assert back is not None
    assert [h for h, _ in back] == [0, 1, 2] and [d for _, d in back] == a.block_table
    assert len(a.block_table) == len(table) and a.host_blocks == []
    assert bm.free_host_blocks == 4
    counts = bm.counts()
    assert counts["swap_out_blocks"] == 3 and counts["swap_in_blocks"] == 3
    check_refcounts(bm, [a, b])


def test_a_shared_block_is_still_copied_on_swap_out():
    bm = BlockManager(num_blocks=8, block_size=BS, num_host_blocks=8)
    prefix = list(range(100, 108))
    a = seq("a", prefix + [1])
    b = seq("b", prefix + [2])
    compute_all(bm, a)
    compute_all(bm, b)
    assert a.block_table[:2] == b.block_table[:2]
    pairs = bm.swap_out(b)
    assert [d for d, _ in pairs] == a.block_table[:2] + [pairs[2][0]]
    assert len({h for _, h in pairs}) == 3        # b's own host copies
    assert [bm.ref_count(x) for x in a.block_table] == [1, 1, 1]
    check_refcounts(bm, [a, b])
    # freeing a swapped sequence releases its host blocks
    bm.free(b)
    assert bm.free_host_blocks == 8


# ---- property test -----------------------------------------------------------------------

PREFIXES = [(), (7, 7, 7, 7), (1, 2, 3, 4, 5, 6, 7, 8), (1, 2, 3, 4, 9, 9)]


class BlockMachine(RuleBasedStateMachine):
    """Random admissions, chunks, frees and swaps against a model of block contents."""

    @initialize(num_blocks=st.integers(2, 10), block_size=st.integers(1, 4),
                host=st.integers(0, 8), caching=st.booleans())
    def setup(self, num_blocks, block_size, host, caching):
        self.bm = BlockManager(num_blocks, block_size, prefix_caching=caching, num_host_blocks=host)
        self.bs = block_size
        self.device = [[None] * block_size for _ in range(num_blocks)]
        self.host = [[None] * block_size for _ in range(host)]
        self.fresh = []                           # not admitted
        self.active = []                          # holding device blocks
        self.swapped = []
        self.count = 0

    def _check_contents(self, s):
        for p in range(s.num_computed):
            assert self.device[s.block_table[p // self.bs]][p % self.bs] == s.tokens[p], (s, p)

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(2, 4), min_size=1, max_size=9))
    def new(self, prefix, tail):
        self.count += 1
        self.fresh.append(seq(f"s{self.count}", prefix + tuple(tail)))

    @precondition(lambda self: self.fresh)
    @rule(pick=st.integers(0, 99), frac=st.floats(0, 1))
    def admit(self, pick, frac):
        s = self.fresh[pick % len(self.fresh)]
        hits = self.bm.lookup(s)
        hit_tokens = len(hits) * self.bs
        n = max(1, round(frac * (s.num_tokens - hit_tokens)))
        need = self.bm.blocks_needed(s, n, hits)
        free_before = self.bm.free_blocks
        assert self.bm.match_prefix(s) == hit_tokens
        assert s.block_table == hits
        self._check_contents(s)                   # a hit is a real match
        ok = self.bm.allocate(s, n)
        assert ok == (need <= free_before)
        if ok:
            assert self.bm.free_blocks == free_before - need
            self.fresh.remove(s)
            self.active.append(s)
            self._write(s, n)
        else:                                     # undo the match, as a scheduler would
            self.bm.free(s)
            s.num_computed = 0

    def _write(self, s, n):
        for p in range(s.num_computed, s.num_computed + n):
            block = s.block_table[p // self.bs]
            assert self.bm.ref_count(block) == 1, "a write into a shared block"
            self.device[block][p % self.bs] = s.tokens[p]
        s.num_computed += n
        self.bm.commit(s)
        if s.num_computed == s.num_tokens:        # it samples: one more token
            s.tokens.append(2 + (sum(s.tokens) % 3))

    @precondition(lambda self: self.active)
    @rule(pick=st.integers(0, 99), n=st.integers(1, 5))
    def step(self, pick, n):
        s = self.active[pick % len(self.active)]
        n = min(n, s.num_tokens - s.num_computed)
        before = {b: self.bm.hash_of(b) for b in range(self.bm.num_blocks)}
        table = list(s.block_table)
        if self.bm.allocate(s, n):
            for b in s.block_table[len(table):]:
                old = before[b]
                assert self.bm.hash_of(b) is None
                if old is not None:               # evicted: its hash no longer hits
                    assert self.bm.cached_block(old) is None
            self._write(s, n)
        else:
            assert s.block_table == table

    @precondition(lambda self: self.active)
    @rule(pick=st.integers(0, 99))
    def free(self, pick):
        s = self.active.pop(pick % len(self.active))
        self.bm.free(s)
        assert s.block_table == []

    @precondition(lambda self: self.active)
    @rule(pick=st.integers(0, 99))
    def swap_out(self, pick):
        s = self.active[pick % len(self.active)]
        table = list(s.block_table)
        free_host = self.bm.free_host_blocks
        pairs = self.bm.swap_out(s)
        if pairs is None:
            assert free_host < len(table) and s.block_table == table
            return
        assert [d for d, _ in pairs] == table and [h for _, h in pairs] == s.host_blocks
        assert len(set(s.host_blocks)) == len(table) and s.block_table == []
        for d, h in pairs:
            self.host[h] = list(self.device[d])
        self.active.remove(s)
        self.swapped.append((s, len(table)))

    @precondition(lambda self: self.swapped)
    @rule(pick=st.integers(0, 99))
    def swap_in(self, pick):
        s, length = self.swapped[pick % len(self.swapped)]
        pairs = self.bm.swap_in(s)
        if pairs is None:
            assert self.bm.free_blocks < length and s.block_table == []
            return
        assert len(s.block_table) == length and s.host_blocks == []
        assert [d for _, d in pairs] == s.block_table
        for h, d in pairs:
            self.device[d] = list(self.host[h])
        self.swapped.remove((s, length))
        self.active.append(s)
        self._check_contents(s)
        self.bm.commit(s)

    @invariant()
    def consistent(self):
        if not hasattr(self, "bm"):
            return
        check_refcounts(self.bm, self.active + self.fresh)
        host_held = [h for s, _ in self.swapped for h in s.host_blocks]
        assert len(host_held) == len(set(host_held))
        assert self.bm.free_host_blocks + len(host_held) == self.bm.num_host_blocks
        holders = {}
        for s in self.active:
            self._check_contents(s)
            for i, b in enumerate(s.block_table):
                holders.setdefault(b, []).append((s, i))
        for b, hs in holders.items():
            if len(hs) > 1:                       # shared blocks are full, computed, cached
                assert self.bm.hash_of(b) is not None
                for s, i in hs:
                    assert (i + 1) * self.bs <= s.num_computed
        for b in range(self.bm.num_blocks):       # the cache index agrees with the blocks
            key = self.bm.hash_of(b)
            if key is not None:
                assert self.bm.cached_block(key) == b


BlockMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
TestBlockMachine = BlockMachine.TestCase


def test_swapped_in_blocks_are_registered_again():
    bm = BlockManager(num_blocks=3, block_size=BS, num_host_blocks=3)
    a = seq("a", range(100, 109))                 # 2 full blocks and one partial
    compute_all(bm, a)
    assert bm.swap_out(a) is not None
    filler = seq("f", range(200, 212))            # evicts every cached block of a
    compute_all(bm, filler)
    bm.free(filler)
    assert bm.lookup(seq("probe", range(100, 109))) == []
    assert bm.swap_in(a) is not None
    bm.commit(a)                                  # the next step's commit
    assert bm.lookup(seq("probe2", range(100, 109))) == a.block_table[:2]
