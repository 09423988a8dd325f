"""Several devices and the fabric between them: peer copies and collective costs.

A :class:`Topology` is ``devices`` simulated devices joined by one of three
fabrics, each parameterised by the chip spec's ``peer_link_bandwidth`` (``B``,
per direction per device) and ``peer_link_latency_s`` (``alpha``, per hop):

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
  successor -- on a switch ``2(N-1)*alpha + 2(N-1)/N * n/B``;
* tree all-reduce: binomial-tree reduce then broadcast, ``2*ceil(log2 N)``
  phases of ``n`` bytes -- on a switch ``2*ceil(log2 N)*(alpha + n/B)``;
* all-gather and reduce-scatter (ring): ``N-1`` phases of ``n/N``;
* broadcast: ``ring`` is a pipelined chain (every chain link carries ``n`` at
  once, latency summed over the chain), ``tree`` is ``ceil(log2 N)`` binomial
  phases of ``n``;
* all-to-all: one phase, every device sending ``n/N`` to every other device.

``n`` is always the size of one device's full buffer (the all-reduce buffer,
the gathered output of an all-gather, the input of a reduce-scatter), as
collective benchmarks count it.  The ring algorithm runs one ring (one channel):
on a mesh it uses one link per device, which is why a mesh is slower than a
switch for rings but as fast for all-to-all, where every link is busy.
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

    # ---------------------------------------------------------------- construction
    @classmethod
    def build(cls, spec: ChipSpec, devices: int, kind: str = "switch") -> Topology:
        """A fabric of ``kind`` over ``devices`` devices of chip ``spec``."""
        if kind not in KINDS:
            raise ValueError(
                f"unknown topology {kind!r}; choose one of: {', '.join(KINDS)}"
            )
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ValueError(f"a topology needs a whole number of devices >= 1, got {devices!r}")
        big_b = float(spec.peer_link_bandwidth)
        n = devices
        links: dict[_Link, float] = {}
        if kind == "switch":
            bw = big_b
            if n > 1:
                for d in range(n):
                    links[(d, "switch")] = bw
                    links[("switch", d)] = bw
        elif kind == "mesh":
            bw = big_b / (n - 1) if n > 1 else big_b
            for a in range(n):
                for b in range(n):
                    if a != b:
                        links[(a, b)] = bw
        else:  # ring
            bw = big_b if n <= 2 else big_b / 2
            if n > 1:
                for d in range(n):
                    links[(d, (d + 1) % n)] = bw
                    links[((d + 1) % n, d)] = bw
        return cls(kind=kind, devices=n, link_bandwidth=bw,
                   link_latency_s=float(spec.peer_link_latency_s), port_bandwidth=big_b,
                   links=links)

    def summary(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "devices": self.devices,
            "link_bandwidth": self.link_bandwidth,
            "link_latency_s": self.link_latency_s,
            "port_bandwidth": self.port_bandwidth,
            "links": len(self.links),
        }

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

    def link_engines(self, device: int) -> list[str]:
        """Timeline engines of ``device``'s outgoing peer links (one per link)."""
        self._check_device(device, "source")
        if self.devices == 1:
            return []
        if self.kind == "switch":
            return ["peer"]
        if self.kind == "mesh":
            return [f"peer{d}" for d in range(self.devices) if d != device]
        return ["peer+"] if self.devices == 2 else ["peer+", "peer-"]

    def egress(self, src: int, dst: int) -> str:
        """The timeline engine (outgoing link of ``src``) a copy to ``dst`` starts on."""
        self.hops(src, dst)
        if self.kind == "switch":
            return "peer"
        if self.kind == "mesh":
            return f"peer{dst}"
        fwd = (dst - src) % self.devices
        return "peer+" if fwd <= self.devices - fwd or self.devices == 2 else "peer-"

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
        """Device-to-device hops between ``src`` and ``dst`` (a switch traversal is one hop)."""
        self._check_device(src, "source")
        self._check_device(dst, "destination")
        if src == dst:
            return 0
        if self.kind == "ring":
            fwd = (dst - src) % self.devices
            return min(fwd, self.devices - fwd)
        return 1

    def _routes(self, src: int, dst: int) -> list[tuple[list[_Link], float]]:
        """Paths from src to dst as (links, fraction of the bytes)."""
        if self.kind == "switch":
            return [([(src, "switch"), ("switch", dst)], 1.0)]
        if self.kind == "mesh":
            return [([(src, dst)], 1.0)]
        n = self.devices
        fwd = (dst - src) % n
        cw: list[tuple[Node, Node]] = [((src + i) % n, (src + i + 1) % n) for i in range(fwd)]
        ccw: list[tuple[Node, Node]] = [((src - i) % n, (src - i - 1) % n) for i in range(n - fwd)]
        if len(cw) < len(ccw):
            return [(cw, 1.0)]
        if len(ccw) < len(cw):
            return [(ccw, 1.0)]
        return [(cw, 0.5), (ccw, 0.5)]

    def phase_time(self, transfers: list[tuple[int, int, float]]) -> float:
        """Time of a set of concurrent transfers ``(src, dst, nbytes)``:
        ``alpha * max hops + max over links of (load / bandwidth)``."""
        load: dict[_Link, float] = {}
        max_hops = 0
        for src, dst, nbytes in transfers:
            if src == dst:
                continue
            max_hops = max(max_hops, self.hops(src, dst))
            for path, frac in self._routes(src, dst):
                for link in path:
                    load[link] = load.get(link, 0.0) + nbytes * frac
        if not load and max_hops == 0:
            return 0.0
        beta = max((b / self.links[link] for link, b in load.items()), default=0.0)
        return max_hops * self.link_latency_s + beta

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
        one = self.phase_time([(d, (d + 1) % n, chunk) for d in range(n)])
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
