"""The collective algorithms: which one runs (:func:`choose`) and the schedule each builds.

Every collective is a schedule of peer copies and small pointwise kernels
on the ranks' queues (:class:`~.schedule.Schedule`):

* ring all-reduce = ring reduce-scatter + ring all-gather.  At reduce-scatter
  step ``s`` (``0 <= s < N-1``) rank ``r`` sends chunk ``c = (r-s-1) mod N``
  (its input chunk at ``s = 0``, its partial sum after) into the staging
  buffer of rank ``r+1``, which runs ``partial = incoming op local``.  The
  copy waits for the sender's previous reduction (its data) and for the
  receiver's previous reduction (its staging buffer is free again: NCCL's
  credits); the reduction waits for the incoming copy and for its own rank's
  send of the step.  Rank ``p`` ends with chunk ``p`` reduced; the
  all-gather's ``N-1`` steps forward chunks round the ring into every
  rank's output.  Every ring step's copy is striped over the fabric's
  channels (:meth:`.schedule.Schedule.ring_copy`: ``N-1`` parts on a full
  mesh, one per link, as NCCL/RCCL's channels use every link); the reduction
  waits for all parts, and the data flow and summation order stay the ring's.
* tree all-reduce: binomial tree rooted at rank 0 (level ``k``: rank
  ``i + 2^k`` sends its buffer to rank ``i`` for ``i`` a multiple of
  ``2^(k+1)``; the parent runs ``buf = local op incoming``), then the same
  tree broadcasts the result down.
* all-gather and reduce-scatter: the ring halves above; broadcast: ``ring``
  is a chain from the root pipelined in slices of ``chunk_bytes``, ``tree``
  the binomial broadcast; all-to-all: every rank copies chunk ``j`` of its
  input to rank ``j`` directly (on its send queue to ``j``).

**Summation order** (what a float64-free, bit-exact reference computes): the
ring sums chunk ``c`` (elements of ``np.array_split(range(count), N)[c]``)
in ring order starting at rank ``c+1``:
``((x[c+1] + x[c+2]) + ...) + x[c]`` (indices mod ``N``); the tree sums
pairwise by binomial levels, ``((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))``
for eight ranks.  ``avg`` divides that sum by ``N`` once, on the rank that
holds the finished chunk (ring) or on the root (tree), before the result is
spread.  ``max`` and ``min`` do not depend on order.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from ...sim.topology import Topology
from ..driver import Marker
from ..ir import DType
from .calls import REDUCTIONS, Call
from .schedule import Schedule

#: (rank, chunk) -> a device address
Address = Callable[[int, int], int]
#: builds one collective's copies and kernels into a schedule from every rank's call
Builder = Callable[[Schedule, list[Call]], None]


def bounds(count: int, n: int) -> list[tuple[int, int]]:
    """Chunk c of ``count`` elements split over ``n`` ranks: ``np.array_split``'s bounds."""
    q, rem = divmod(count, n)
    out, lo = [], 0
    for c in range(n):
        hi = lo + q + (1 if c < rem else 0)
        out.append((lo, hi))
        lo = hi
    return out


def tree_levels(n: int) -> list[list[tuple[int, int]]]:
    """Binomial tree rooted at rank 0: per level, the (child, parent) pairs."""
    levels, k = [], 0
    while (1 << k) < n:
        step = 1 << k
        levels.append([(i + step, i) for i in range(0, n, 2 * step) if i + step < n])
        k += 1
    return levels


def choose(op: str, nbytes: int, requested: str | None, devices: Sequence[int],
           topology: Topology | None, facts: dict[str, Any]) -> tuple[str, str]:
    """(algorithm, reason): ring or tree, by the topology's alpha-beta cost of the copies each
    would make, unless ``requested``; the other collectives have one algorithm."""
    if op not in ("all_reduce", "broadcast"):
        return ("direct", "one copy per rank pair") if op == "all_to_all" else (
            "ring", "ring is the only algorithm for this collective")
    n = len(devices)
    if requested is not None:
        return requested, f"{facts['algorithms'][requested]} requested"
    if n == 1:
        return "ring", "one rank: a local copy"
    if topology is None:
        raise ValueError("ranks on several devices need the fabric that joins them")
    fabric = topology
    channels = fabric.ring_channels(devices)      # a ring step's parts, each on its own link
    ring_pairs = [(devices[r], devices[(r + 1) % n]) for r in range(n)]
    levels = tree_levels(n)

    def pair_time(nb: float, pairs: list[tuple[int, int]]) -> float:
        return max(fabric.peer_copy_time(max(1, int(nb)), a, b) for a, b in pairs)

    tree_pairs = [[(devices[c], devices[p]) for c, p in lvl] for lvl in levels]
    if op == "all_reduce":
        ring = 2 * (n - 1) * pair_time(nbytes / n / channels, ring_pairs)
        tree = 2 * sum(pair_time(nbytes, lvl) for lvl in tree_pairs)
    else:
        slices = max(1, math.ceil(nbytes / int(facts["chunk_bytes"])))
        ring = (slices + n - 2) * pair_time(nbytes / slices, ring_pairs[:-1])
        tree = sum(pair_time(nbytes, lvl) for lvl in tree_pairs)
    pick = "tree" if tree < ring else "ring"
    why = (f"{pick}: estimated {min(ring, tree) * 1e6:.3g} us vs {max(ring, tree) * 1e6:.3g} us "
           f"for {'ring' if pick == 'tree' else 'tree'} on the {fabric.kind} fabric "
           f"({'latency' if pick == 'tree' else 'bandwidth'}-bound message)")
    return pick, why


# ---- ring halves, shared ----------------------------------------------------------------------
def ring_reduce_scatter(S: Schedule, chunks: list[tuple[int, int]], src: Address, final: Address,
                        fn: str, dt: DType, avg: bool) -> list[Marker | None]:
    """The ring reduce-scatter of all-reduce and reduce-scatter; returns, per rank, the marker
    of its finished chunk."""
    n, item = S.size, dt.itemsize
    biggest = max(hi - lo for lo, hi in chunks) * item
    scratch = [S.host.scratch(r, biggest) for r in range(n)]
    prev: list[Marker | None] = [None] * n           # each rank's last reduction
    done: list[Marker | None] = [None] * n
    for s in range(n - 1):
        sends: dict[int, tuple[int, int, list[Marker]]] = {}
        for r in range(n):
            p, c = (r + 1) % n, (r - s - 1) % n
            lo, hi = chunks[c]
            if hi == lo:
                continue
            data = src(r, c) if s == 0 else scratch[r][1]
            sends[p] = (r, c, S.ring_copy(r, p, scratch[p][0], data, (hi - lo) * item,
                                          [prev[r], prev[p]]))
        for p, (r, c, parts) in sends.items():
            lo, hi = chunks[c]
            last = s == n - 2
            out = final(p, c) if last else scratch[p][1]
            own = sends.get((p + 1) % n)
            prev[p] = S.combine(p, fn, dt, hi - lo, scratch[p][0], src(p, c), out,
                                [*parts, *(own[2] if own else ())])
            if last and avg:
                prev[p] = S.scale(p, dt, hi - lo, out)
            if last:
                done[p] = prev[p]
    return done


def ring_all_gather(S: Schedule, chunks: list[tuple[int, int]], buf: Address,
                    have: Sequence[Marker | None], dt: DType) -> None:
    """The ring all-gather: ``N-1`` steps forward every chunk round the ring into ``buf``."""
    n, item = S.size, dt.itemsize
    last: list[list[Marker | None]] = [[m] for m in have]
    for s in range(n - 1):
        new: list[list[Marker | None]] = [[] for _ in range(n)]
        for r in range(n):
            p, c = (r + 1) % n, (r - s) % n
            lo, hi = chunks[c]
            if hi == lo:
                continue
            new[p] = list(S.ring_copy(r, p, buf(p, c), buf(r, c), (hi - lo) * item, last[r]))
        last = new


def _tree_down(S: Schedule, recv: list[int], last: list[Marker | None], nbytes: int,
               rank_of: Callable[[int], int]) -> None:
    for level in reversed(tree_levels(S.size)):
        for child, parent in level:
            a, b = rank_of(parent), rank_of(child)
            last[b] = S.copy(a, b, recv[b], recv[a], nbytes, [last[a]])


def _single(S: Schedule, calls: list[Call], nbytes: int) -> None:
    for c in calls:
        if c.send != c.recv:
            S.local(c.rank, c.recv, c.send, nbytes)


# ---- the collectives --------------------------------------------------------------------------
def all_reduce_ring(S: Schedule, calls: list[Call]) -> None:
    n, c0 = S.size, calls[0]
    dt, item = c0.dtype, c0.dtype.itemsize
    if n == 1:
        _single(S, calls, c0.count * item)
        return
    chunks = bounds(c0.count, n)
    send = [c.send for c in calls]
    recv = [c.recv for c in calls]
    reduction = c0.reduction_name()
    done = ring_reduce_scatter(S, chunks, lambda r, c: send[r] + chunks[c][0] * item,
                               lambda r, c: recv[r] + chunks[c][0] * item, REDUCTIONS[reduction],
                               dt, reduction == "avg")
    ring_all_gather(S, chunks, lambda r, c: recv[r] + chunks[c][0] * item, done, dt)


def all_reduce_tree(S: Schedule, calls: list[Call]) -> None:
    n, c0 = S.size, calls[0]
    dt, nbytes = c0.dtype, c0.count * c0.dtype.itemsize
    if n == 1:
        _single(S, calls, nbytes)
        return
    recv = [c.recv for c in calls]
    stage = [S.host.scratch(r, nbytes)[0] for r in range(n)]
    last: list[Marker | None] = [S.local(c.rank, c.recv, c.send, nbytes) if c.send != c.recv else None
                                 for c in calls]
    reduction = c0.reduction_name()
    fn = REDUCTIONS[reduction]
    for level in tree_levels(n):
        for child, parent in level:
            m = S.copy(child, parent, stage[parent], recv[child], nbytes, [last[child], last[parent]])
            last[parent] = S.combine(parent, fn, dt, c0.count, recv[parent], stage[parent],
                                     recv[parent], [m])
    if reduction == "avg":
        last[0] = S.scale(0, dt, c0.count, recv[0], [])
    _tree_down(S, recv, last, nbytes, lambda v: v)


def broadcast_tree(S: Schedule, calls: list[Call]) -> None:
    n, c0 = S.size, calls[0]
    nbytes, root = c0.count * c0.dtype.itemsize, c0.root_rank()
    recv = [c.recv for c in calls]
    last: list[Marker | None] = [None] * n
    if calls[root].send != recv[root]:
        last[root] = S.local(root, recv[root], calls[root].send, nbytes)
    _tree_down(S, recv, last, nbytes, lambda v: (v + root) % n)


def broadcast_ring(S: Schedule, calls: list[Call]) -> None:
    n, c0 = S.size, calls[0]
    item, root = c0.dtype.itemsize, c0.root_rank()
    nbytes = c0.count * item
    recv = [c.recv for c in calls]
    first = None
    if calls[root].send != recv[root]:
        first = S.local(root, recv[root], calls[root].send, nbytes)
    step = max(item, int(S.host.facts["chunk_bytes"]) // item * item)
    for lo in range(0, nbytes, step):
        size = min(step, nbytes - lo)
        have = first
        for v in range(n - 1):
            a, b = (root + v) % n, (root + v + 1) % n
            have = S.copy(a, b, recv[b] + lo, recv[a] + lo, size, [have])


def all_gather(S: Schedule, calls: list[Call]) -> None:
    n, c0 = S.size, calls[0]
    item, count = c0.dtype.itemsize, c0.count
    chunks = [(r * count, (r + 1) * count) for r in range(n)]
    recv = [c.recv for c in calls]
    have = [S.local(c.rank, recv[c.rank] + c.rank * count * item, c.send, count * item)
            if c.send != recv[c.rank] + c.rank * count * item else None for c in calls]
    ring_all_gather(S, chunks, lambda r, c: recv[r] + chunks[c][0] * item, have, c0.dtype)


def reduce_scatter(S: Schedule, calls: list[Call]) -> None:
    n, c0 = S.size, calls[0]
    dt, item, count = c0.dtype, c0.dtype.itemsize, c0.count
    if n == 1:
        _single(S, calls, count * item)
        return
    chunks = [(r * count, (r + 1) * count) for r in range(n)]
    send = [c.send for c in calls]
    recv = [c.recv for c in calls]
    reduction = c0.reduction_name()
    ring_reduce_scatter(S, chunks, lambda r, c: send[r] + chunks[c][0] * item,
                        lambda r, c: recv[r], REDUCTIONS[reduction], dt, reduction == "avg")


def all_to_all(S: Schedule, calls: list[Call]) -> None:
    n, c0 = S.size, calls[0]
    chunk = c0.count * c0.dtype.itemsize
    for c in calls:
        r = c.rank
        S.local(r, c.recv + r * chunk, c.send + r * chunk, chunk)
        for k in range(1, n):                # staggered: rank r starts with rank r+1
            j = (r + k) % n
            S.copy(r, j, calls[j].recv + r * chunk, c.send + j * chunk, chunk)


#: the schedule builder of each collective and algorithm: ``{op}_{algorithm}`` for all-reduce
#: and broadcast, ``{op}`` for the others
BUILDERS: dict[str, Builder] = {
    "all_reduce_ring": all_reduce_ring,
    "all_reduce_tree": all_reduce_tree,
    "broadcast_ring": broadcast_ring,
    "broadcast_tree": broadcast_tree,
    "all_gather": all_gather,
    "reduce_scatter": reduce_scatter,
    "all_to_all": all_to_all,
}


def builder(op: str, algorithm: str) -> Builder:
    """The schedule builder of collective ``op`` run with ``algorithm``."""
    return BUILDERS[f"{op}_{algorithm}" if op in ("all_reduce", "broadcast") else op]
