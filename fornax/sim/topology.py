"""Several devices and the fabric between them: peer copies and collective costs.

A :class:`Topology` is ``devices`` simulated devices joined by one of three
fabrics, each parameterised by the chip spec's achievable peer bandwidth ``B``
(``peer_link_bandwidth x peer_link_efficiency``, per direction per device: the
datasheet figure less the links' protocol overhead) and ``peer_link_latency_s``
(``alpha``, per hop):

``switch``
    switched all-to-all (NVSwitch-like): every device has one port of ``B``
    into a non-blocking switch; any pair is one hop apart.
``mesh``
    fully connected (Infinity-Fabric-like): each device's ``B`` is split over
    ``N-1`` direct links of ``B/(N-1)``; any pair is one hop apart, but one
    transfer only gets one link.
``ring``
    each device is linked to its two neighbours with ``B/2`` per link (one link
    of ``B`` when there are two devices); a transfer between non-neighbours
    takes the shorter way round, several hops (a tie is split over both ways).

Costs follow the alpha-beta model.  A *phase* is a set of transfers in flight
at once; it takes ``alpha * (most hops of any transfer) + max over links of
(bytes routed over the link / link bandwidth)``, so the bottleneck link of the
fabric sets the bandwidth term and transfers are cut-through (pipelined over
hops).  Collectives are sequences of phases:

* ring all-reduce: ``2(N-1)`` phases, each device sending ``n/N`` to its ring
  successor, striped over the fabric's channels (below) -- on a switch and on a
  full mesh ``2(N-1)*alpha + 2(N-1)/N * n/B``;
* tree all-reduce: binomial-tree reduce then broadcast, ``2*ceil(log2 N)``
  phases of ``n`` bytes -- on a switch ``2*ceil(log2 N)*(alpha + n/B)``;
* all-gather and reduce-scatter (ring): ``N-1`` phases of ``n/N``;
* broadcast: ``ring`` is a pipelined chain (every chain link carries ``n`` at
  once, latency summed over the chain), ``tree`` is ``ceil(log2 N)`` binomial
  phases of ``n``;
* all-to-all: one phase, every device sending ``n/N`` to every other device.

``n`` is always the size of one device's full buffer (the all-reduce buffer,
the gathered output of an all-gather, the input of a reduce-scatter), as
collective benchmarks count it.

**Channels.**  A collective library runs its ring algorithm over several
channels at once (NCCL/RCCL channels), each a ring of its own, so that every
link a device has carries part of each ring step.  On a switch or a ring
fabric one ring already loads a device's port (or its one forward link), so
the ring runs one channel.  On a full mesh of ``N`` devices one ring would use
one of each device's ``N-1`` links; the library stripes each step over ``N-1``
channels (:meth:`Topology.ring_channels`): a step's ``n/N`` from each device
leaves in ``N-1`` parts, part ``k`` over the link to the ``k``-th device after
its ring successor (:meth:`Topology.ring_link`), so every directed link carries
one part per step -- the load of ``N-1`` edge-disjoint rings (a complete
directed graph splits into ``N-1`` Hamiltonian cycles for every ``N`` but 4
and 6, where this is a slightly optimistic bound).  A copy priced on another
link than its own (``egress(src, dst, link)``) is how an executed schedule
keeps one ring's data flow (and its summation order) while its steps take the
channels' time.  Point-to-point copies, trees, broadcast chains and all-to-all
keep their own routes.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .memory import DeviceMemory
from .spec import ChipSpec
from .timeline import Timeline

#: fabric kinds and what each models
KINDS: dict[str, str] = {
    "switch": "switched all-to-all (NVSwitch-like): one port of the peer bandwidth per device",
    "mesh": "fully connected (Infinity-Fabric-like): peer bandwidth split over N-1 direct links",
    "ring": "each device linked to its two neighbours; non-neighbours take several hops",
}

#: collective algorithms
ALGORITHMS = ("ring", "tree")

#: a node of the fabric: a device index, or "switch"
Node = int | str
_Link = tuple[Node, Node]  # (from node, to node)


class Member(Protocol):
    """What joining a fabric needs of a device (:class:`~fornax.sim.device.Device` is one)."""

    index: int
    topology: Topology | None
    memory: DeviceMemory
    timeline: Timeline


@dataclass
class Topology:
    """``devices`` devices joined by a fabric of directed links."""

    kind: str
    devices: int
    link_bandwidth: float          # bandwidth of one directed link, bytes/s
    link_latency_s: float          # latency of one hop, seconds
    port_bandwidth: float          # a device's total peer bandwidth per direction, bytes/s
    links: dict[_Link, float] = field(default_factory=dict)
    #: the node each device is in (all 0 on one node); devices of a node share the intra-node
    #: fabric of ``kind``, devices of different nodes talk through their NICs (the scale-out tier)
    node_of: tuple[int, ...] = ()
    nic_bandwidth: float = 0.0     # a device's NIC, bytes/s per direction
    nic_latency_s: float = 0.0     # one transfer between nodes, seconds

    # ---------------------------------------------------------------- construction
    @classmethod
    def build(cls, spec: ChipSpec, devices: int, kind: str = "switch",
              nodes: int | Sequence[int] = 1) -> Topology:
        """A fabric of ``kind`` over ``devices`` devices of chip ``spec``, on ``nodes`` nodes:
        a count (the devices split into equal consecutive blocks) or each device's node.
        Within a node the devices are joined by ``kind``; between nodes every device has a
        NIC of the spec's ``nic_bandwidth`` into a non-blocking network."""
        if kind not in KINDS:
            raise ValueError(
                f"unknown topology {kind!r}; choose one of: {', '.join(KINDS)}"
            )
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ValueError(f"a topology needs a whole number of devices >= 1, got {devices!r}")
        node_of = _nodes(devices, nodes)
        big_b = float(spec.peer_link_achievable)
        links: dict[_Link, float] = {}
        bw = big_b
        many = len(set(node_of)) > 1
        for node in sorted(set(node_of)):
            members = [d for d in range(devices) if node_of[d] == node]
            n = len(members)
            hub = f"switch{node}" if many else "switch"
            if kind == "switch":
                bw = big_b
                if n > 1:
                    for d in members:
                        links[(d, hub)] = bw
                        links[(hub, d)] = bw
            elif kind == "mesh":
                bw = big_b / (n - 1) if n > 1 else big_b
                for a in members:
                    for b in members:
                        if a != b:
                            links[(a, b)] = bw
            else:  # ring
                bw = big_b if n <= 2 else big_b / 2
                if n > 1:
                    for i, d in enumerate(members):
                        nxt = members[(i + 1) % n]
                        links[(d, nxt)] = bw
                        links[(nxt, d)] = bw
        nic = float(spec.nic_bandwidth)
        if many:
            for d in range(devices):
                links[(d, "net")] = nic
                links[("net", d)] = nic
        return cls(kind=kind, devices=devices, link_bandwidth=bw,
                   link_latency_s=float(spec.peer_link_latency_s), port_bandwidth=big_b,
                   links=links, node_of=node_of, nic_bandwidth=nic,
                   nic_latency_s=float(spec.nic_latency_s))

    @property
    def nodes(self) -> int:
        return len(set(self.node_of)) if self.node_of else 1

    def summary(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "devices": self.devices,
            "link_bandwidth": self.link_bandwidth,
            "link_latency_s": self.link_latency_s,
            "port_bandwidth": self.port_bandwidth,
            "links": len(self.links),
        }
        if self.nodes > 1:
            out.update(nodes=self.nodes, nic_bandwidth=self.nic_bandwidth, nic_latency_s=self.nic_latency_s)
        return out

    # ---------------------------------------------------------------- devices
    def connect(self, devices: Sequence[Member]) -> None:
        """Join simulated devices (``devices[i].index == i``) into this fabric: each gets
        ``.topology``, one timeline engine per outgoing peer link, and its memory learns
        the other devices' memories (so a fault can name the owner of a remote address)."""
        if len(devices) != self.devices:
            raise ValueError(f"a {self.devices}-device topology cannot connect {len(devices)} devices")
        for i, dev in enumerate(devices):
            if dev.index != i:
                raise ValueError(f"device at position {i} has index {dev.index}; connect devices in order")
        for dev in devices:
            dev.topology = self
            dev.memory.fabric = [o.memory for o in devices if o is not dev]
            for name in self.link_engines(dev.index):
                dev.timeline.add_engine(name)

    def _node(self, d: int) -> int:
        return self.node_of[d] if self.node_of else 0

    def _members(self, d: int) -> list[int]:
        """The devices of ``d``'s node, in order."""
        node = self._node(d)
        return [x for x in range(self.devices) if self._node(x) == node]

    def link_engines(self, device: int) -> list[str]:
        """Timeline engines of ``device``'s outgoing peer links (one per link)."""
        self._check_device(device, "source")
        nic = ["peer-nic"] if self.nodes > 1 else []
        members = self._members(device)
        if len(members) == 1:
            return nic
        if self.kind == "switch":
            return ["peer", *nic]
        if self.kind == "mesh":
            return [*(f"peer{d}" for d in members if d != device), *nic]
        return (["peer+"] if len(members) == 2 else ["peer+", "peer-"]) + nic

    def egress(self, src: int, dst: int, link: int | None = None) -> str:
        """The timeline engine (outgoing link of ``src``) a copy to ``dst`` starts on; ``link``
        (a collective's channel part, :meth:`ring_link`) prices it on ``src``'s direct link to
        that device of its node instead -- on a mesh, the only fabric with such links."""
        self.hops(src, dst)
        if link is not None and link != dst:
            self._check_device(link, "link")
            if self.kind != "mesh" or link == src or self._node(link) != self._node(src) \
                    or self._node(dst) != self._node(src):
                raise ValueError(f"device {src} has no direct link to device {link} that a copy "
                                 f"to device {dst} can be priced on (only a mesh's node members "
                                 "are linked directly)")
        if self._node(src) != self._node(dst):
            return "peer-nic"
        if self.kind == "switch":
            return "peer"
        if self.kind == "mesh":
            return f"peer{dst if link is None else link}"
        members = self._members(src)
        n = len(members)
        fwd = (members.index(dst) - members.index(src)) % n
        return "peer+" if fwd <= n - fwd or n == 2 else "peer-"

    # ---------------------------------------------------------------- channels
    def ring_channels(self, devices: Sequence[int] | None = None) -> int:
        """How many channels a ring collective over ``devices`` (default: all, in order) stripes
        each step over: on a full mesh whose devices share one node, one per link of a device
        (``N-1``); else one (a switch port or a ring link is already all a step can use)."""
        members = list(range(self.devices)) if devices is None else list(devices)
        for d in members:
            self._check_device(d, "ring")
        n = len(members)
        if self.kind != "mesh" or n < 3 or len({self._node(d) for d in members}) > 1:
            return 1
        return n - 1

    @staticmethod
    def ring_link(ring: Sequence[int], position: int, channel: int) -> int:
        """The device whose link from ``ring[position]`` carries channel ``channel``'s part of
        its step to its ring successor: the ``channel``-th device after the successor in ring
        order (channel 0: the successor itself).  When every member sends to its successor,
        the ``len(ring) - 1`` channels load each directed link between members once."""
        n = len(ring)
        if n < 2:
            raise ValueError(f"a ring step needs two or more members, got {list(ring)!r}")
        return ring[(position + 1 + channel % (n - 1)) % n]

    # ---------------------------------------------------------------- routing
    def _check_device(self, d: int, what: str) -> None:
        try:
            ok = not isinstance(d, bool) and 0 <= operator.index(d) < self.devices
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(
                f"{what} device {d!r} is not in this {self.devices}-device topology "
                f"(devices 0..{self.devices - 1})"
            )

    def hops(self, src: int, dst: int) -> int:
        """Device-to-device hops between ``src`` and ``dst`` (a switch traversal is one hop; so is
        the network between two nodes)."""
        self._check_device(src, "source")
        self._check_device(dst, "destination")
        if src == dst:
            return 0
        if self._node(src) != self._node(dst):
            return 1
        if self.kind == "ring":
            members = self._members(src)
            n = len(members)
            fwd = (members.index(dst) - members.index(src)) % n
            return min(fwd, n - fwd)
        return 1

    def latency(self, src: int, dst: int) -> float:
        """The latency of one transfer from ``src`` to ``dst``: per hop within a node, the
        network's between nodes."""
        if self._node(src) != self._node(dst):
            return self.nic_latency_s
        return self.hops(src, dst) * self.link_latency_s

    def _routes(self, src: int, dst: int) -> list[tuple[list[_Link], float]]:
        """Paths from src to dst as (links, fraction of the bytes)."""
        if self._node(src) != self._node(dst):
            return [([(src, "net"), ("net", dst)], 1.0)]
        if self.kind == "switch":
            hub: Node = f"switch{self._node(src)}" if self.nodes > 1 else "switch"
            return [([(src, hub), (hub, dst)], 1.0)]
        if self.kind == "mesh":
            return [([(src, dst)], 1.0)]
        members = self._members(src)
        n = len(members)
        i, j = members.index(src), members.index(dst)
        fwd = (j - i) % n
        cw: list[tuple[Node, Node]] = [(members[(i + k) % n], members[(i + k + 1) % n]) for k in range(fwd)]
        ccw: list[tuple[Node, Node]] = [(members[(i - k) % n], members[(i - k - 1) % n])
                                        for k in range(n - fwd)]
        if len(cw) < len(ccw):
            return [(cw, 1.0)]
        if len(ccw) < len(cw):
            return [(ccw, 1.0)]
        return [(cw, 0.5), (ccw, 0.5)]

    def phase_time(self, transfers: list[tuple[int, int, float]]) -> float:
        """Time of a set of concurrent transfers ``(src, dst, nbytes)``:
        ``the largest latency of any transfer + max over links of (load / bandwidth)``."""
        load: dict[_Link, float] = {}
        alpha = 0.0
        moved = False
        for src, dst, nbytes in transfers:
            if src == dst:
                continue
            moved = True
            alpha = max(alpha, self.latency(src, dst))
            for path, frac in self._routes(src, dst):
                for link in path:
                    load[link] = load.get(link, 0.0) + nbytes * frac
        if not load and not moved:
            return 0.0
        beta = max((b / self.links[link] for link, b in load.items()), default=0.0)
        return alpha + beta

    # ---------------------------------------------------------------- point to point
    def peer_copy_time(self, nbytes: int, src: int, dst: int) -> float:
        """Seconds to copy ``nbytes`` from device ``src`` to device ``dst`` over the fabric."""
        _check_bytes(nbytes)
        self._check_device(src, "source")
        self._check_device(dst, "destination")
        if src == dst:
            raise ValueError(
                f"a peer copy needs two different devices, got device {src} twice "
                "(a copy within one device is a device-to-device copy)"
            )
        return self.phase_time([(src, dst, float(nbytes))])

    # ---------------------------------------------------------------- collectives
    def _ring_phases(self, steps: int, chunk: float) -> float:
        n = self.devices
        ring = list(range(n))
        parts = self.ring_channels(ring)
        one = self.phase_time([(d, self.ring_link(ring, d, k), chunk / parts)
                               for d in range(n) for k in range(parts)])
        return steps * one

    def _tree_levels(self) -> list[list[tuple[int, int]]]:
        """Binomial tree rooted at device 0: per level, the (child, parent) pairs."""
        levels = []
        k = 0
        while (1 << k) < self.devices:
            step = 1 << k
            levels.append([(i + step, i) for i in range(0, self.devices, 2 * step)
                           if i + step < self.devices])
            k += 1
        return levels

    def _tree_reduce(self, nbytes: float) -> float:
        return sum(self.phase_time([(c, p, nbytes) for c, p in lvl]) for lvl in self._tree_levels())

    def _tree_broadcast(self, nbytes: float) -> float:
        return sum(self.phase_time([(p, c, nbytes) for c, p in lvl])
                   for lvl in reversed(self._tree_levels()))

    def allreduce_time(self, nbytes: int, algorithm: str = "ring") -> float:
        """All-reduce of an ``nbytes`` buffer on every device."""
        _check_bytes(nbytes)
        _check_algorithm(algorithm)
        n = self.devices
        if n == 1:
            return 0.0
        if algorithm == "ring":
            return self._ring_phases(2 * (n - 1), nbytes / n)
        return self._tree_reduce(float(nbytes)) + self._tree_broadcast(float(nbytes))

    def all_gather_time(self, nbytes: int) -> float:
        """Ring all-gather producing an ``nbytes`` buffer on every device (``nbytes/N`` each in)."""
        _check_bytes(nbytes)
        n = self.devices
        return 0.0 if n == 1 else self._ring_phases(n - 1, nbytes / n)

    def reduce_scatter_time(self, nbytes: int) -> float:
        """Ring reduce-scatter of an ``nbytes`` buffer (``nbytes/N`` each out)."""
        _check_bytes(nbytes)
        n = self.devices
        return 0.0 if n == 1 else self._ring_phases(n - 1, nbytes / n)

    def broadcast_time(self, nbytes: int, algorithm: str = "ring", root: int = 0) -> float:
        """Broadcast ``nbytes`` from ``root`` to every device."""
        _check_bytes(nbytes)
        _check_algorithm(algorithm)
        self._check_device(root, "root")
        n = self.devices
        if n == 1:
            return 0.0
        if algorithm == "tree":
            return self._tree_broadcast(float(nbytes))
        chain = [((root + i) % n, (root + i + 1) % n) for i in range(n - 1)]
        latency = sum(self.hops(a, b) for a, b in chain) * self.link_latency_s
        bandwidth = self.phase_time([(a, b, float(nbytes)) for a, b in chain])
        bandwidth -= max(self.hops(a, b) for a, b in chain) * self.link_latency_s
        return latency + bandwidth

    def all_to_all_time(self, nbytes: int) -> float:
        """All-to-all: every device sends ``nbytes/N`` to every other device, all at once."""
        _check_bytes(nbytes)
        n = self.devices
        if n == 1:
            return 0.0
        chunk = nbytes / n
        return self.phase_time([(a, b, chunk) for a in range(n) for b in range(n) if a != b])

    def collective_time(self, op: str, nbytes: int, algorithm: str = "ring") -> float:
        """Dispatch by collective name (allreduce, all_gather, reduce_scatter, broadcast, all_to_all)."""
        if op in ("allreduce", "all_reduce"):
            return self.allreduce_time(nbytes, algorithm)
        if op == "broadcast":
            return self.broadcast_time(nbytes, algorithm)
        simple = {"all_gather": self.all_gather_time, "allgather": self.all_gather_time,
                  "reduce_scatter": self.reduce_scatter_time,
                  "reducescatter": self.reduce_scatter_time,
                  "all_to_all": self.all_to_all_time, "alltoall": self.all_to_all_time}
        if op not in simple:
            raise ValueError(
                f"unknown collective {op!r}; choose one of: allreduce, all_gather, "
                "reduce_scatter, broadcast, all_to_all"
            )
        if algorithm != "ring":
            raise ValueError(f"{op} is modelled with the ring algorithm only, got {algorithm!r}")
        return simple[op](nbytes)


def _nodes(devices: int, nodes: int | Sequence[int]) -> tuple[int, ...]:
    """Each device's node, from a node count (equal consecutive blocks) or an explicit list."""
    if isinstance(nodes, bool):
        raise ValueError(f"nodes must be a count or one node number per device, got {nodes!r}")
    if isinstance(nodes, int):
        if nodes < 1 or devices % nodes:
            raise ValueError(f"{devices} devices do not split evenly over {nodes} node(s)")
        per = devices // nodes
        return tuple(d // per for d in range(devices))
    try:
        out = tuple(operator.index(n) for n in nodes)
    except TypeError:
        raise ValueError(f"nodes must be a count or one node number per device, got {nodes!r}") from None
    if len(out) != devices or any(n < 0 for n in out):
        raise ValueError(f"nodes must list one non-negative node number per device ({devices}), "
                         f"got {list(out)!r}")
    return out


def _check_bytes(nbytes: int) -> None:
    try:
        ok = not isinstance(nbytes, bool) and operator.index(nbytes) >= 0
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"a transfer size must be a whole number of bytes >= 0, got {nbytes!r}")


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown collective algorithm {algorithm!r}; choose one of: "
                         f"{', '.join(ALGORITHMS)}")


__all__ = ["ALGORITHMS", "KINDS", "Topology"]
