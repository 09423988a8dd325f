"""One collective's schedule: its peer copies and kernels on the ranks' queues, ordered by
markers across devices, run to completion in one simulated-time order.

A :class:`Schedule` is built on a :class:`ScheduleHost` (the communicator:
its ranks' stream queues, per-peer send queues, contexts and timelines, its
reduction kernels and scratch buffers).  A copy runs on the send queue of
its (source, destination, channel) triple, on the fabric link its packets
name; the first copy of a triple also waits for everything the user submitted
before on both ranks.  A ring step's copy (:meth:`Schedule.ring_copy`) is
striped over the fabric's channels (``Topology.ring_channels``): on a full
mesh, ``N-1`` parts, part ``k`` priced on the link to the ``k``-th rank after
the destination (``Topology.ring_link``), as NCCL/RCCL's channels load every
link; the bytes still go to the destination, so the ring's data flow and
summation order are the same on every fabric.  :meth:`Schedule.finish` orders each rank's stream
after everything of the collective that touched it and runs all ranks'
timelines together (:func:`fornax.sim.timeline.run_together`).  A
collective's time runs from the moment the last rank's stream reaches the
call to the moment the last copy or kernel of it ends.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol

from ...sim.timeline import Timeline, run_together
from ...sim.topology import Topology
from ..driver import Context, Marker, Module, Queue
from ..errors import FornaxError
from ..ir import DType
from .kernels import KernelKey

#: a loaded reduction kernel: (module, entry, grid)
KernelEntry = tuple[Module, str, tuple[int, int, int]]


class ScheduleHost(Protocol):
    """What a schedule needs of its communicator."""

    @property
    def size(self) -> int:
        """The number of ranks."""
    @property
    def facts(self) -> dict[str, Any]:
        """The family's ``[library.collectives]`` facts (``chunk_bytes``, ``algorithms``, ...)."""
    @property
    def queues(self) -> list[Queue]:
        """Each rank's in-order stream queue, by rank."""
    @property
    def peer_queues(self) -> dict[tuple[int, int, int], Queue]:
        """The send queues created so far, by (source rank, destination rank, channel)."""
    @property
    def contexts(self) -> list[Context]:
        """Each rank's runtime context, by rank."""

    @property
    def ring(self) -> list[int]:
        """Each rank's device index, by rank (the ring's order)."""
    @property
    def ring_channels(self) -> int:
        """The channels a ring step is striped over (``Topology.ring_channels`` of the ranks)."""

    def peer_queue(self, src: int, dst: int, channel: int = 0) -> Queue:
        """The send queue of ``channel`` from rank ``src`` to rank ``dst`` (created on first
        use)."""
    def timeline(self, r: int) -> Timeline:
        """Rank ``r``'s device timeline."""
    def timelines(self) -> list[Timeline]:
        """Every rank's device timeline, each once."""
    def error(self, condition: str, message: str, call: str | None = None,
              hint: str | None = None) -> FornaxError:
        """The family's error for ``condition`` (``[library.collectives.errors]``)."""
    def reduction_kernel(self, r: int, key: KernelKey) -> KernelEntry:
        """The reduction kernel ``key`` loaded for rank ``r``'s device."""
    def scratch(self, r: int, nbytes: int) -> tuple[int, int]:
        """A staging buffer and a partial-sum buffer of ``nbytes`` each on rank ``r``."""


class Schedule:
    """The copies and kernels of one collective, with their cross-device markers."""

    def __init__(self, host: ScheduleHost) -> None:
        self.host = host
        self.size = host.size
        # everything each rank submitted before: its stream (and what its stream was told to
        # wait for since its last command), and every copy to or from it
        self.start = {r: [host.queues[r].record(), *host.queues[r].waiting(),
                          *(q.record() for (a, b, _), q in host.peer_queues.items() if r in (a, b))]
                      for r in range(host.size)}
        self.markers: list[Marker] = []
        self.used: set[tuple[int, int, int]] = set()
        self.copies = 0
        self.kernels = 0

    def ready_time(self, r: int) -> float:
        times = [m.sem.reached_at(m.value) or 0.0 for m in self.start[r] if m.value > 0]
        return max([self.host.timeline(r).host_time, *times])

    def _mark(self, q: Queue) -> Marker:
        m = q.record()
        self.markers.append(m)
        return m

    def copy(self, src: int, dst: int, dst_addr: int, src_addr: int, nbytes: int,
             deps: Iterable[Marker | None] = (), channel: int = 0, link: int | None = None) -> Marker:
        """A peer copy from rank ``src`` to rank ``dst`` after ``deps``, on ``channel``'s send
        queue, priced on the link to device ``link`` (None: its own route)."""
        q = self.host.peer_queue(src, dst, channel)
        waits = [m for m in deps if m is not None]
        if (src, dst, channel) not in self.used:   # the user's earlier work on both ranks
            self.used.add((src, dst, channel))
            waits += [*self.start[src], *self.start[dst]]
        for m in waits:
            q.wait(m)
        if link is None:            # a driver written before channels takes the plain call
            q.copy_peer(self.host.contexts[dst], int(dst_addr), int(src_addr), int(nbytes))
        else:
            q.copy_peer(self.host.contexts[dst], int(dst_addr), int(src_addr), int(nbytes), link)
        self.copies += 1
        return self._mark(q)

    def ring_copy(self, src: int, dst: int, dst_addr: int, src_addr: int, nbytes: int,
                  deps: Iterable[Marker | None] = ()) -> list[Marker]:
        """A ring step's copy from rank ``src`` to its successor ``dst``, striped over the
        channels (one part per channel, byte ranges as ``np.array_split`` makes them; parts
        of no bytes are left out); returns every part's marker."""
        if dst != (src + 1) % self.size:
            raise ValueError(f"a ring step goes to the next rank: {src} -> {(src + 1) % self.size}, "
                             f"not {dst}")
        deps = list(deps)
        parts = self.host.ring_channels
        if parts == 1:
            return [self.copy(src, dst, dst_addr, src_addr, nbytes, deps)]
        q, rem = divmod(int(nbytes), parts)
        out, lo = [], 0
        for k in range(parts):
            size = q + (1 if k < rem else 0)
            if size:
                link = Topology.ring_link(self.host.ring, src, k)
                out.append(self.copy(src, dst, dst_addr + lo, src_addr + lo, size, deps, k, link))
            lo += size
        return out

    def local(self, r: int, dst: int, src: int, nbytes: int,
              deps: Iterable[Marker | None] = ()) -> Marker:
        """A copy within rank ``r``'s memory, on its stream, after ``deps``."""
        q = self.host.queues[r]
        for m in deps:
            if m is not None:
                q.wait(m)
        q.copy_d2d(int(dst), int(src), int(nbytes))
        return self._mark(q)

    def combine(self, r: int, fn: str, dtype: DType, n: int, a: int, b: int, out: int,
                deps: Iterable[Marker | None] = ()) -> Marker:
        """``out = a fn b`` over ``n`` elements on rank ``r``, after ``deps``."""
        return self._kernel(r, ("combine", fn, dtype, n), {"a": a, "b": b, "out": out}, deps)

    def scale(self, r: int, dtype: DType, n: int, buf: int,
              deps: Iterable[Marker | None] = ()) -> Marker:
        """``buf = buf / N`` (the rank count) over ``n`` elements on rank ``r``, after ``deps``."""
        return self._kernel(r, ("div", self.size, dtype, n), {"a": buf, "out": buf}, deps)

    def _kernel(self, r: int, key: KernelKey, args: dict[str, int],
                deps: Iterable[Marker | None]) -> Marker:
        q = self.host.queues[r]
        for m in deps:
            if m is not None:
                q.wait(m)
        module, entry, grid = self.host.reduction_kernel(r, key)
        q.launch(module, entry, grid, {k: int(v) for k, v in args.items()})
        self.kernels += 1
        return self._mark(q)

    def finish(self) -> tuple[float, float]:
        """Order each rank's stream after everything of this collective that touched it, run
        all ranks' timelines together until it is done; returns (start, end) times."""
        host = self.host
        for r in range(host.size):
            for s, d, k in self.used:
                if r in (s, d):
                    host.queues[r].wait(host.peer_queue(s, d, k).record())
        timelines = host.timelines()
        ok = run_together(timelines, lambda: all(m.sem.value >= m.value for m in self.markers))
        failed = next((m.sem.failure for m in self.markers if m.sem.failure is not None), None)
        if failed is not None:
            raise host.error("device_error", f"a copy or kernel of the collective failed: {failed}",
                             hint="see the driver's report for the fault")
        if not ok:
            raise host.error("internal", "the collective's schedule stalled before it completed")
        start = max(self.ready_time(r) for r in range(host.size))
        end = max([start, *(m.sem.reached_at(m.value) or 0.0 for m in self.markers)])
        for tl in timelines:
            tl.commit_until(end)
        return start, end
