"""The simulated time of one collective between the ranks' devices, from the topology.

The ranks' devices are joined by the stack's fabric (``Topology.build(spec, world, kind)``:
the chip spec's peer links, switch / mesh / ring).  The collective library of the stack's
family picks the algorithm the way the in-process communicator does
(:func:`fornax.layers.collectives.algorithms.choose`: ring or tree by the alpha-beta cost),
and the topology prices it.  Every rank computes the same figure, so a collective that
starts at the latest arrival ends at the same simulated time everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ....layers.collectives.algorithms import choose
from ....sim.topology import Topology

#: bus-bandwidth factor per collective over N ranks (nccl-tests' convention)
BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
       "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}


@dataclass(frozen=True)
class Priced:
    """A collective's algorithm, why, and its simulated duration."""

    algorithm: str
    reason: str
    seconds: float


def price(topology: Topology | None, facts: dict[str, Any], op: str, nbytes: int,
          root: int = 0, peer: int | None = None, rank: int = 0) -> Priced:
    """The simulated cost of ``op`` over ``nbytes`` (the buffer size nccl-tests counts: the
    all-reduce buffer, the gathered output, the scattered input) between the world's ranks."""
    if topology is None or topology.devices == 1:
        return Priced("local", "one rank: nothing crosses the fabric", 0.0)
    n = topology.devices
    ranks = list(range(n))
    if op in ("all_reduce", "broadcast"):
        algo, why = choose(op, max(nbytes, 1), None, ranks, topology, facts)
        if op == "all_reduce":
            return Priced(algo, why, topology.allreduce_time(nbytes, algo))
        return Priced(algo, why, topology.broadcast_time(nbytes, algo, root))
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        algo = "direct" if op == "all_to_all" else "ring"
        return Priced(algo, f"{algo}: the only algorithm for {op}",
                      topology.collective_time(op, nbytes, "ring"))
    if op == "reduce":      # a binomial tree towards the root: half a tree all-reduce
        return Priced("tree", "tree: binomial reduce to the root",
                      topology.allreduce_time(nbytes, "tree") / 2)
    if op in ("gather", "scatter"):   # the root's link carries N-1 chunks at once
        chunk = nbytes / n
        pairs = [(r, root, chunk) if op == "gather" else (root, r, chunk) for r in ranks if r != root]
        return Priced("direct", "direct: every chunk over its own pair, the root's link shared",
                      topology.phase_time(pairs))
    if op in ("send", "recv"):
        if peer is None:
            raise ValueError(f"{op} needs its peer rank")
        a, b = (rank, peer) if op == "send" else (peer, rank)
        return Priced("p2p", "one peer copy", topology.peer_copy_time(nbytes, int(a), int(b)))
    if op == "barrier":    # a one-word all-reduce, as NCCL-based barriers are
        return Priced("ring", "a one-word all-reduce", topology.allreduce_time(4, "ring"))
    raise ValueError(f"no cost model for collective {op!r}")
