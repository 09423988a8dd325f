"""Collectives (NCCL/RCCL/oneCCL-like): a communicator over several simulated devices.

A :class:`Communicator` joins ``N`` devices of one stack, one *rank* per device.
Each rank has its own runtime context and an in-order stream on its device,
plus one send queue per peer (NCCL's channels): a peer copy runs on the
fabric link (``Topology.egress``) its queue's packets name, so copies to
different peers can overlap where the fabric has several links.

**Data really moves.**  Every collective is a schedule of peer copies
(``QueueBase.copy_peer``) and small pointwise kernels (``out = a op b``, built
with the ISA and shipped in the library's own image format) on the ranks'
queues, ordered by markers across devices:

* ring all-reduce = ring reduce-scatter + ring all-gather.  At reduce-scatter
  step ``s`` (``0 <= s < N-1``) rank ``r`` sends chunk ``c = (r-s-1) mod N``
  (its input chunk at ``s = 0``, its partial sum after) into the staging
  buffer of rank ``r+1``, which runs ``partial = incoming op local``.  The
  copy waits for the sender's previous reduction (its data) and for the
  receiver's previous reduction (its staging buffer is free again: NCCL's
  credits); the reduction waits for the incoming copy and for its own rank's
  send of the step.  Rank ``p`` ends with chunk ``p`` reduced; the
  all-gather's ``N-1`` steps forward chunks round the ring into every
  rank's output.
* tree all-reduce: binomial tree rooted at rank 0 (level ``k``: rank
  ``i + 2^k`` sends its buffer to rank ``i`` for ``i`` a multiple of
  ``2^(k+1)``; the parent runs ``buf = local op incoming``), then the same
  tree broadcasts the result down.
* all-gather and reduce-scatter: the ring halves above; broadcast: ``ring``
  is a chain from the root pipelined in slices of ``chunk_bytes``, ``tree``
  the binomial broadcast; all-to-all: every rank copies chunk ``j`` of its
  input to rank ``j`` directly (on its send queue to ``j``); send/recv: one
  peer copy.

**Summation order** (what a float64-free, bit-exact reference computes): the
ring sums chunk ``c`` (elements of ``np.array_split(range(count), N)[c]``)
in ring order starting at rank ``c+1``:
``((x[c+1] + x[c+2]) + ...) + x[c]`` (indices mod ``N``); the tree sums
pairwise by binomial levels, ``((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))``
for eight ranks.  ``avg`` divides that sum by ``N`` once, on the rank that
holds the finished chunk (ring) or on the root (tree), before the result is
spread.  ``max`` and ``min`` do not depend on order.

**Time** comes from executing that schedule: every copy is priced by the
topology's alpha-beta model on its link, every kernel by the cost model, and
the packets of all ranks run in one simulated-time order
(:func:`fornax.sim.timeline.run_together`).  A collective's time runs from
the moment the last rank's stream reaches the call to the moment the last
copy or kernel of it ends.  Bus bandwidth is computed as nccl-tests does:
``algbw = S / t`` and ``busbw = algbw * 2(N-1)/N`` for all-reduce,
``(N-1)/N`` for all-gather, reduce-scatter and all-to-all, ``1`` for
broadcast and send/recv (``S``: the all-reduce buffer, the gathered output,
the reduce-scatter input, the all-to-all buffer of one rank).

**Ordering rules.**  Every rank must issue the same collectives in the same
order.  ``comm.rank(r).all_reduce(...)`` enqueues rank ``r``'s call; a
collective executes once every rank's oldest pending call is the same one
(same op, count, dtype, reduction, root and algorithm); a send executes with
its peer's matching recv.  Calls that disagree, or a rank that never makes
its call, leave the other ranks blocked, as on real hardware: when the host
waits (:meth:`Work.wait`, :meth:`Communicator.synchronize`) the watchdog
fires after ``timeout_s`` of simulated time on every blocked rank, the
communicator is aborted, and the error names each rank and its pending call
(which rank skipped which call).  Codes: disagreeing calls are the family's
*invalid usage* (``ncclInvalidUsage``: the calls themselves are wrong); a
rank that never joins is a *remote error* (``ncclRemoteError``: what a rank
waiting on a peer that stopped participating reports); oneCCL-like throws
``ccl::exception`` with its ``ccl::status`` (``runtime_error``).  Which code
each condition maps to is data (``[library.collectives.errors]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..sim import isa
from ..sim.faults import PageFault
from ..sim.timeline import Packet, Semaphore, run_together
from .codegen import POINTWISE_REGISTERS, KernelBuilder, next_pow2, static_counters
from .driver import Marker
from .errors import ErrorTable, FornaxError
from .graph import DType
from .runtime import NON_BLOCKING

#: collective name -> nccl-tests bus-bandwidth factor as a function of N
BUS_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
REDUCTIONS = {"sum": "add", "max": "max", "min": "min", "avg": "add"}
_BLOCK = 1024


@dataclass
class CollectiveRecord:
    """One executed collective (or send/recv pair), for the library report."""

    op: str                          # all_reduce, all_gather, ... send_recv
    call: str                        # the family's name: ncclAllReduce, ccl::allreduce, ...
    ranks: int
    count: int
    dtype: str
    bytes: int                       # S, as nccl-tests counts it
    algorithm: str
    reason: str
    time_s: float
    algbw: float                     # bytes / s
    busbw: float                     # bytes / s
    reduction: str | None = None
    root: int | None = None
    start_s: float = 0.0
    copies: int = 0
    kernels: int = 0

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in (
            "op", "call", "ranks", "count", "dtype", "bytes", "algorithm", "reason", "time_s",
            "algbw", "busbw", "reduction", "root", "start_s", "copies", "kernels")}


@dataclass(eq=False)
class _Call:
    rank: int
    seq: int                         # 1-based index of this call among the rank's calls
    op: str
    count: int
    dtype: DType
    send: int
    recv: int
    reduction: str | None = None
    root: int | None = None
    peer: int | None = None
    algorithm: str | None = None
    done: bool = False

    def signature(self) -> tuple:
        return (self.op, self.count, self.dtype, self.reduction, self.root, self.algorithm)


@dataclass(eq=False)
class Work:
    """A rank's handle on one of its calls (like ``torch.distributed``'s ``Work``)."""

    comm: "Communicator"
    rank: int
    call: _Call

    def is_completed(self) -> bool:
        return self.call.done

    def wait(self) -> None:
        """The host waits for this call on this rank; a call that cannot complete (its
        peers never match it) ends in the watchdog's diagnosis, never a hang."""
        self.comm._check_aborted()
        if not self.call.done:
            self.comm._watchdog([self.rank])
        self.comm._sync_rank(self.rank)


class RankComm:
    """The calls one rank makes (``comm.rank(r)``); each enqueues and returns a :class:`Work`."""

    def __init__(self, comm: "Communicator", rank: int):
        self.comm, self.index = comm, rank

    def all_reduce(self, send: int, recv: int, count: int, dtype="float32", op: str = "sum",
                   algorithm: str | None = None) -> Work:
        """``recv = op over ranks of send`` (``count`` elements; ``send == recv`` is in place)."""
        return self.comm._post(self.index, "all_reduce", send, recv, count, dtype, reduction=op,
                               algorithm=algorithm)

    def all_gather(self, send: int, recv: int, count: int, dtype="float32") -> Work:
        """``recv[r*count:(r+1)*count] = send of rank r`` (``count`` elements per rank)."""
        return self.comm._post(self.index, "all_gather", send, recv, count, dtype)

    def reduce_scatter(self, send: int, recv: int, count: int, dtype="float32",
                       op: str = "sum") -> Work:
        """``recv = op over ranks of send[rank*count:(rank+1)*count]`` (``count`` per rank)."""
        return self.comm._post(self.index, "reduce_scatter", send, recv, count, dtype, reduction=op)

    def broadcast(self, send: int, recv: int, count: int, dtype="float32", root: int = 0,
                  algorithm: str | None = None) -> Work:
        """``recv = send of rank root`` on every rank (``send`` is read on the root only)."""
        return self.comm._post(self.index, "broadcast", send, recv, count, dtype, root=root,
                               algorithm=algorithm)

    def all_to_all(self, send: int, recv: int, count: int, dtype="float32") -> Work:
        """``recv[j*count:(j+1)*count] = send[rank*count:...] of rank j`` (``count`` per pair)."""
        return self.comm._post(self.index, "all_to_all", send, recv, count, dtype)

    def send(self, buf: int, count: int, dtype="float32", peer: int = 0) -> Work:
        return self.comm._post(self.index, "send", buf, 0, count, dtype, peer=peer)

    def recv(self, buf: int, count: int, dtype="float32", peer: int = 0) -> Work:
        return self.comm._post(self.index, "recv", 0, buf, count, dtype, peer=peer)

    def synchronize(self) -> None:
        """The host waits for every call this rank made."""
        self.comm._check_aborted()
        if self.comm._pending[self.index]:
            self.comm._watchdog([self.index])
        self.comm._sync_rank(self.index)


class _Schedule:
    """The copies and kernels of one collective, with their cross-device markers."""

    def __init__(self, comm: "Communicator"):
        self.comm = comm
        # everything each rank submitted before: its stream, and every copy to or from it
        self.start = {r: [comm._main[r].record(),
                          *(q.record() for (a, b), q in comm._send.items() if r in (a, b))]
                      for r in range(comm.size)}
        self.markers: list[Marker] = []
        self.used: set[tuple[int, int]] = set()
        self.copies = 0
        self.kernels = 0

    def ready_time(self, r: int) -> float:
        times = [m.sem.reached_at(m.value) or 0.0 for m in self.start[r] if m.value > 0]
        return max([self.comm._timeline(r).host_time, *times])

    def _mark(self, q) -> Marker:
        m = q.record()
        self.markers.append(m)
        return m

    def copy(self, src: int, dst: int, dst_addr: int, src_addr: int, nbytes: int,
             deps=()) -> Marker:
        q = self.comm._send_queue(src, dst)
        deps = [m for m in deps if m is not None]
        if (src, dst) not in self.used:            # the user's earlier work on both ranks
            self.used.add((src, dst))
            deps += [*self.start[src], *self.start[dst]]
        for m in deps:
            q.wait(m)
        q.copy_peer(self.comm._ctx[dst], int(dst_addr), int(src_addr), int(nbytes))
        self.copies += 1
        return self._mark(q)

    def local(self, r: int, dst: int, src: int, nbytes: int, deps=()) -> Marker:
        q = self.comm._main[r]
        for m in deps:
            if m is not None:
                q.wait(m)
        q.copy_d2d(int(dst), int(src), int(nbytes))
        return self._mark(q)

    def combine(self, r: int, fn: str, dtype: DType, n: int, a: int, b: int, out: int,
                deps=()) -> Marker:
        return self._kernel(r, ("combine", fn, dtype, n), {"a": a, "b": b, "out": out}, deps)

    def scale(self, r: int, dtype: DType, n: int, buf: int, deps=()) -> Marker:
        return self._kernel(r, ("div", self.comm.size, dtype, n), {"a": buf, "out": buf}, deps)

    def _kernel(self, r: int, key: tuple, args: dict, deps) -> Marker:
        q = self.comm._main[r]
        for m in deps:
            if m is not None:
                q.wait(m)
        module, entry, grid = self.comm._kernel(r, key)
        q.launch(module, entry, grid, {k: int(v) for k, v in args.items()})
        self.kernels += 1
        return self._mark(q)

    def finish(self) -> tuple[float, float]:
        """Order each rank's stream after everything of this collective that touched it, run
        all ranks' timelines together until it is done; returns (start, end) times."""
        comm = self.comm
        for r in range(comm.size):
            for s, d in self.used:
                if r in (s, d):
                    comm._main[r].wait(comm._send_queue(s, d).record())
        timelines = comm._timelines()
        ok = run_together(timelines, lambda: all(m.sem.value >= m.value for m in self.markers))
        failed = next((m.sem.failure for m in self.markers if m.sem.failure is not None), None)
        if failed is not None:
            raise comm._error("device_error", f"a copy or kernel of the collective failed: {failed}",
                              hint="see the driver's report for the fault")
        if not ok:
            raise comm._error("internal", "the collective's schedule stalled before it completed")
        start = max(self.ready_time(r) for r in range(comm.size))
        end = max([start, *(m.sem.reached_at(m.value) or 0.0 for m in self.markers)])
        for tl in timelines:
            tl.commit_until(end)
        return start, end


class Communicator:
    """``N`` ranks over devices of one stack (``library.communicator(devices)``)."""

    def __init__(self, library, devices=None, timeout_s: float | None = None):
        self.library = library
        self.runtime = library.runtime
        self.driver = self.runtime.driver
        facts = library.facts["library"].get("collectives")
        self.vendor = library.vendor
        if not facts:
            raise FornaxError(f"library {library.name} has no collectives", seam="library",
                              vendor=self.vendor, hint="add a [library.collectives] table")
        self.facts = facts
        self.name: str = facts["name"]
        e = facts["errors"]
        self.errors = ErrorTable(e["api"], e["codes"], e["conditions"], seam="library",
                                 vendor=self.vendor)
        count = self.driver.device_count()
        devices = list(range(count)) if devices is None else devices
        try:
            devices = [int(d) for d in devices]
            ok = all(0 <= d < count for d in devices) and len(set(devices)) == len(devices)
        except (TypeError, ValueError):
            ok = False
        if not ok or not devices:
            raise self._error("invalid_argument", f"a communicator needs distinct device indices "
                              f"in 0..{count - 1}, got {devices!r}", call="comm_init")
        self.devices = devices
        self.size = len(devices)
        timeout = float(facts["watchdog_s"]) if timeout_s is None else timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise self._error("invalid_argument", f"timeout_s must be a positive number of seconds, "
                              f"got {timeout_s!r}", call="comm_init")
        self.timeout_s = float(timeout)
        sim = [self.driver.devices[d] for d in devices]
        self.topology = sim[0].topology
        if self.size > 1 and (self.topology is None or any(s.topology is not self.topology
                                                           for s in sim)):
            raise self._error("invalid_argument", "the devices are not joined by one fabric",
                              call="comm_init", hint="compose the stack with devices > 1")
        self.meta = any(s.meta for s in sim)
        self._ctx = [self.runtime.context(d) for d in devices]
        prev = self.runtime.current_device()
        self.streams = []
        try:
            for d in devices:
                self.runtime.set_device(d)
                self.streams.append(self.runtime.create_stream(NON_BLOCKING, in_order=True))
        finally:
            self.runtime.set_device(prev)
        self._main = [s.queue for s in self.streams]
        self._send: dict[tuple[int, int], object] = {}
        self._scratch: dict[int, tuple[int, int]] = {}     # rank -> (address, bytes)
        self._kernels: dict[tuple, tuple] = {}
        self._pending: list[list[_Call]] = [[] for _ in devices]
        self._calls = [0] * self.size
        self._last: list[_Call | None] = [None] * self.size
        self.aborted: FornaxError | None = None
        shared = getattr(library, "collective_records", None)     # the library's report lists them
        self.records: list[CollectiveRecord] = shared if isinstance(shared, list) else []
        self._watchdog_sems: list[Semaphore] = []

    # -- helpers ------------------------------------------------------------------------------
    def rank(self, r: int) -> RankComm:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.size:
            raise self._error("invalid_argument", f"rank {r!r} is not in this {self.size}-rank "
                              f"communicator (ranks 0..{self.size - 1})", call="comm_rank")
        return RankComm(self, r)

    def call_name(self, op: str) -> str:
        return self.facts["calls"].get(op, op)

    def _error(self, condition: str, message: str, call: str | None = None,
               hint: str | None = None) -> FornaxError:
        name = self.errors.faults.get(condition) or self.errors.faults["unknown"]
        return self.errors.error(name, message, op=self.call_name(call) if call else self.name,
                                 hint=hint)

    def _timeline(self, r: int):
        return self._ctx[r].device.timeline

    def _timelines(self) -> list:
        return list({id(c.device.timeline): c.device.timeline for c in self._ctx}.values())

    def _send_queue(self, src: int, dst: int):
        key = (src, dst)
        if key not in self._send:
            self._send[key] = self.driver.create_queue(self._ctx[src])
        return self._send[key]

    def malloc(self, r: int, nbytes: int) -> int:
        """Device memory on rank ``r``'s device (the runtime's caching allocator)."""
        prev = self.runtime.current_device()
        self.runtime.set_device(self.devices[self.rank(r).index])
        try:
            return self.runtime.malloc(nbytes)
        finally:
            self.runtime.set_device(prev)

    def upload(self, r: int, ptr: int, array: np.ndarray) -> None:
        """Copy ``array`` to ``ptr`` on rank ``r``, in order on the rank's stream."""
        self.runtime.memcpy_h2d(ptr, np.ascontiguousarray(array), self.streams[self.rank(r).index])

    def download(self, r: int, ptr: int, count: int, dtype="float32") -> np.ndarray:
        """Read ``count`` elements at ``ptr`` on rank ``r`` after its stream's work."""
        out = np.empty(int(count), DType.of(dtype).numpy)
        stream = self.streams[self.rank(r).index]
        self.runtime.memcpy_d2h(out, ptr, stream)
        self.runtime.stream_synchronize(stream)
        return out

    def _sync_rank(self, r: int) -> None:
        self.runtime.stream_synchronize(self.streams[r])

    def synchronize(self) -> None:
        """The host waits for every rank; pending calls that cannot match end in the watchdog."""
        self._check_aborted()
        if any(self._pending):
            self._watchdog(list(range(self.size)))
        for r in range(self.size):
            self._sync_rank(r)

    def _check_aborted(self) -> None:
        if self.aborted is not None:
            err = self.aborted
            raise type(err)(f"the communicator was aborted: {err.message}", seam=err.seam,
                            vendor=err.vendor, op=err.op, code=err.code,
                            hint="create a new communicator")

    def _scratch_for(self, r: int, nbytes: int) -> tuple[int, int]:
        """A staging buffer and a partial-sum buffer of ``nbytes`` each on rank ``r``."""
        have = self._scratch.get(r)
        if have is None or have[1] < nbytes:
            size = max(nbytes, 256)
            if have is not None:
                prev = self.runtime.current_device()
                self.runtime.set_device(self.devices[r])
                try:
                    self.runtime.free(have[0])
                finally:
                    self.runtime.set_device(prev)
            have = self._scratch[r] = (self.malloc(r, 2 * size), size)
        return have[0], have[0] + have[1]

    # -- kernels --------------------------------------------------------------------------------
    def _kernel(self, r: int, key: tuple):
        """(module, entry, grid) of a reduction kernel for rank ``r``'s device."""
        kind, fn, dtype, n = key
        dev = self.devices[r]
        props = self.driver.properties(dev)
        image = self.library._image_for(props.target, self.driver.loadable_formats(dev))
        full = (dev, *key, image["format"], image["target"])
        if full not in self._kernels:
            entry = f"{self.name.replace('-', '_')}_{kind}_{fn}_{dtype.value}_{n}"
            program, grid = _reduction_program(entry, kind, fn, dtype, n, self.library.group_size)
            binary = self.library.build([program], image["format"], image["target"])
            prev = self.runtime.current_device()
            self.runtime.set_device(dev)
            try:
                module = self.runtime.load_module(binary)
            finally:
                self.runtime.set_device(prev)
            self._kernels[full] = (module, entry, grid)
        return self._kernels[full]

    # -- posting and matching ----------------------------------------------------------------------
    def _post(self, r: int, op: str, send, recv, count, dtype, reduction=None, root=None,
              peer=None, algorithm=None) -> Work:
        self._check_aborted()
        call = op
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise self._error("invalid_argument", f"rank {r}: count must be a whole number >= 0, "
                              f"got {count!r}", call=call)
        try:
            dt = DType.of(dtype)
        except FornaxError:
            dt = None
        if dt is None or dt.value not in self.facts["dtypes"]:
            raise self._error("invalid_argument", f"rank {r}: {dtype!r} is not a collective data "
                              f"type (supported: {', '.join(self.facts['dtypes'])})", call=call)
        if reduction is not None and reduction not in self.facts["ops"]:
            raise self._error("invalid_argument", f"rank {r}: unknown reduction {reduction!r} "
                              f"(supported: {', '.join(self.facts['ops'])})", call=call)
        if reduction == "avg" and not dt.is_float:
            raise self._error("invalid_argument", f"rank {r}: avg needs a floating-point type, "
                              f"got {dt.value}", call=call)
        if root is not None and (isinstance(root, bool) or not isinstance(root, int)
                                 or not 0 <= root < self.size):
            raise self._error("invalid_argument", f"rank {r}: root {root!r} is not a rank of this "
                              f"{self.size}-rank communicator", call=call)
        if peer is not None and (isinstance(peer, bool) or not isinstance(peer, int)
                                 or not 0 <= peer < self.size or peer == r):
            raise self._error("invalid_argument", f"rank {r}: peer {peer!r} must be another rank "
                              f"of this {self.size}-rank communicator", call=call)
        algos = self.facts["algorithms"]
        if algorithm is not None and (algorithm not in algos or op not in ("all_reduce", "broadcast")):
            raise self._error("invalid_argument", f"rank {r}: algorithm {algorithm!r} is not "
                              f"available for {self.call_name(op)} (all-reduce and broadcast take "
                              f"{', '.join(algos)})", call=call)
        item, n = dt.itemsize, self.size
        sizes = {"all_reduce": (count, count), "all_gather": (count, n * count),
                 "reduce_scatter": (n * count, count), "broadcast": (count, count),
                 "all_to_all": (n * count, n * count), "send": (count, 0), "recv": (0, count)}[op]
        for what, addr, elems in (("send", send, sizes[0]), ("recv", recv, sizes[1])):
            if elems == 0 or (op == "broadcast" and what == "send" and r != root):
                continue
            self._check_buffer(r, what, addr, elems * item, call)
        self._calls[r] += 1
        c = _Call(r, self._calls[r], op, int(count), dt, int(send or 0), int(recv or 0),
                  reduction, root, peer, algorithm)
        self._pending[r].append(c)
        self._progress()
        return Work(self, r, c)

    def _check_buffer(self, r: int, what: str, addr, nbytes: int, call: str) -> None:
        if isinstance(addr, bool) or not isinstance(addr, (int, np.integer)):
            raise self._error("invalid_argument", f"rank {r}: the {what} buffer must be a device "
                              f"address, got {type(addr).__name__}", call=call)
        try:
            self._ctx[r].space.resolve(int(addr), int(nbytes), "read" if what == "send" else "write")
        except PageFault as exc:
            raise self._error("invalid_argument", f"rank {r}: the {what} buffer ({nbytes} bytes at "
                              f"{int(addr):#x}) is not in device {self.devices[r]}'s memory: "
                              f"{exc.detail}", call=call,
                              hint="allocate it on the rank's device (comm.malloc)") from None

    def _progress(self) -> None:
        moved = True
        while moved:
            moved = False
            heads = [p[0] if p else None for p in self._pending]
            for r, h in enumerate(heads):           # point to point: a send meets its recv
                if h is not None and h.op == "send":
                    o = heads[h.peer]
                    if (o is not None and o.op == "recv" and o.peer == r and o.count == h.count
                            and o.dtype == h.dtype):
                        self._pending[r].pop(0)
                        self._pending[h.peer].pop(0)
                        self._send_recv(h, o)
                        moved = True
                        break
            if moved:
                continue
            if all(h is not None and h.op in COLLECTIVES for h in heads) and \
                    len({h.signature() for h in heads}) == 1:
                calls = [p.pop(0) for p in self._pending]
                self._run(calls)
                moved = True

    # -- the watchdog ------------------------------------------------------------------------------
    def _describe(self, c: _Call) -> str:
        args = [f"count={c.count}", c.dtype.value]
        if c.reduction:
            args.append(self.facts["ops"][c.reduction])
        if c.root is not None:
            args.append(f"root={c.root}")
        if c.peer is not None:
            args.append(("to" if c.op == "send" else "from") + f" rank {c.peer}")
        if c.algorithm:
            args.append(self.facts["algorithms"][c.algorithm])
        return f"{self.call_name(c.op)}({', '.join(args)}) (its call #{c.seq})"

    def _diagnose(self) -> tuple[str, str]:
        heads = [p[0] if p else None for p in self._pending]
        waiting = [r for r, h in enumerate(heads) if h is not None]
        lines = []
        p2p = [r for r in waiting if heads[r].op in ("send", "recv")]
        if p2p:
            r = p2p[0]
            h = heads[r]
            o = heads[h.peer]
            want = "recv from" if h.op == "send" else "send to"
            other = (f"its oldest pending call is {self._describe(o)}" if o is not None else
                     self._idle(h.peer))
            lines.append(f"rank {r} waits in {self._describe(h)}; rank {h.peer} has no matching "
                         f"{self.call_name('recv' if h.op == 'send' else 'send')} ({want} rank {r}): "
                         f"{other}")
            condition = "missing_rank" if o is None else "mismatch"
        else:
            groups: dict[tuple, list[int]] = {}
            for r in waiting:
                groups.setdefault(heads[r].signature(), []).append(r)
            missing = [r for r in range(self.size) if heads[r] is None]
            for sig, ranks in groups.items():
                lines.append(f"{_ranks(ranks)} wait{'s' if len(ranks) == 1 else ''} in "
                             f"{self._describe(heads[ranks[0]])}")
            if missing:
                ref = heads[waiting[0]]
                for r in missing:
                    lines.append(f"rank {r} never called {self.call_name(ref.op)} "
                                 f"({self._idle(r)})")
            condition = "mismatch" if len(groups) > 1 else "missing_rank"
        return condition, "; ".join(lines)

    def _idle(self, r: int) -> str:
        last = self._last[r]
        return ("it made no call" if last is None else
                f"its last call was #{last.seq} {self.call_name(last.op)}, which completed")

    def _watchdog(self, ranks: list[int]) -> None:
        """Fire the watchdog for the blocked ranks: each stream waits ``timeout_s`` of simulated
        time in the stuck collective, then the communicator is aborted with a diagnosis."""
        condition, text = self._diagnose()
        blocked = [r for r in range(self.size) if self._pending[r]]
        fired = 0.0
        for r in blocked:
            q = self._main[r]
            tl = self._timeline(r)
            hwq = tl.create_queue(f"{self.name}:watchdog")
            sem = Semaphore(f"{self.name}-watchdog-rank{r}")
            self._watchdog_sems.append(sem)
            m = q.record()
            label = f"{self.call_name(self._pending[r][0].op)} blocked (watchdog)"
            hwq.submit(Packet("compute", lambda t=self.timeout_s: t, label, "collective",
                              waits=[(m.sem, m.value)], signals=[(sem, 1)]))
            tl.wait(sem, 1)
            q.wait(Marker(sem, 1))              # the aborted kernel is gone; the stream goes on
            fired = max(fired, sem.reached_at(1) or 0.0)
        seqs = sorted({self._pending[r][0].seq for r in blocked})
        err = self._error(
            condition,
            f"watchdog: collective operation timed out after {self.timeout_s:g} s of simulated "
            f"time (fired at {fired:.6g} s) on {_ranks(blocked)} (call #{', #'.join(map(str, seqs))}): "
            f"{text}",
            hint="every rank must make the same collective calls in the same order with the same "
                 "count, dtype, reduction and root")
        self.aborted = err
        self._pending = [[] for _ in range(self.size)]
        raise err

    # -- execution -------------------------------------------------------------------------------
    def _choose(self, op: str, nbytes: int, requested: str | None) -> tuple[str, str]:
        """Ring or tree, by the topology's alpha-beta cost of the copies each would make."""
        if op not in ("all_reduce", "broadcast"):
            return ("direct", "one copy per rank pair") if op == "all_to_all" else (
                "ring", "ring is the only algorithm for this collective")
        n = self.size
        if requested is not None:
            return requested, f"{self.facts['algorithms'][requested]} requested"
        if n == 1:
            return "ring", "one rank: a local copy"
        ring_pairs = [(self.devices[r], self.devices[(r + 1) % n]) for r in range(n)]
        levels = _tree_levels(n)

        def pair_time(nb, pairs):
            return max(self.topology.peer_copy_time(max(1, int(nb)), a, b) for a, b in pairs)

        tree_pairs = [[(self.devices[c], self.devices[p]) for c, p in lvl] for lvl in levels]
        if op == "all_reduce":
            ring = 2 * (n - 1) * pair_time(nbytes / n, ring_pairs)
            tree = 2 * sum(pair_time(nbytes, lvl) for lvl in tree_pairs)
        else:
            slices = max(1, math.ceil(nbytes / int(self.facts["chunk_bytes"])))
            ring = (slices + n - 2) * pair_time(nbytes / slices, ring_pairs[:-1])
            tree = sum(pair_time(nbytes, lvl) for lvl in tree_pairs)
        pick = "tree" if tree < ring else "ring"
        why = (f"{pick}: estimated {min(ring, tree) * 1e6:.3g} us vs {max(ring, tree) * 1e6:.3g} us "
               f"for {'ring' if pick == 'tree' else 'tree'} on the {self.topology.kind} fabric "
               f"({'latency' if pick == 'tree' else 'bandwidth'}-bound message)")
        return pick, why

    def _run(self, calls: list[_Call]) -> None:
        c0 = calls[0]
        op, n, dt, count = c0.op, self.size, c0.dtype, c0.count
        item = dt.itemsize
        nbytes = {"all_reduce": count, "broadcast": count, "all_gather": n * count,
                  "reduce_scatter": n * count, "all_to_all": n * count}[op] * item
        algorithm, reason = self._choose(op, nbytes, c0.algorithm)
        sched = _Schedule(self)
        if count > 0:
            getattr(self, f"_{op}_{algorithm}" if op in ("all_reduce", "broadcast") else f"_{op}")(
                sched, calls)
        start, end = sched.finish()
        for c in calls:
            c.done = True
            self._last[c.rank] = c
        self._record(op, count, dt, nbytes, algorithm, reason, start, end, sched,
                     c0.reduction, c0.root)

    def _record(self, op, count, dt, nbytes, algorithm, reason, start, end, sched, reduction=None,
                root=None) -> None:
        t = end - start
        algbw = nbytes / t if t > 0 else 0.0
        call = self.call_name("send") + "/" + self.call_name("recv") if op == "send_recv" else \
            self.call_name(op)
        self.records.append(CollectiveRecord(
            op, call, self.size, count, dt.value, nbytes, algorithm, reason, t, algbw,
            algbw * BUS_FACTOR[op](self.size), reduction, root, start, sched.copies, sched.kernels))

    def _send_recv(self, s: _Call, r: _Call) -> None:
        sched = _Schedule(self)
        nbytes = s.count * s.dtype.itemsize
        if nbytes:
            sched.copy(s.rank, r.rank, r.recv, s.send, nbytes)
        start, end = sched.finish()
        s.done = r.done = True
        self._last[s.rank], self._last[r.rank] = s, r
        self._record("send_recv", s.count, s.dtype, nbytes, "p2p",
                     f"rank {s.rank} -> rank {r.rank}", start, end, sched)

    # ring reduce-scatter shared by all-reduce and reduce-scatter
    def _ring_rs(self, S: _Schedule, calls, bounds, src, final, fn: str, dt: DType, avg: bool):
        n, item = self.size, dt.itemsize
        biggest = max(hi - lo for lo, hi in bounds) * item
        scratch = [self._scratch_for(r, biggest) for r in range(n)]
        prev = [None] * n                       # each rank's last reduction
        done = [None] * n
        for s in range(n - 1):
            sends = {}
            for r in range(n):
                p, c = (r + 1) % n, (r - s - 1) % n
                lo, hi = bounds[c]
                if hi == lo:
                    continue
                data = src(r, c) if s == 0 else scratch[r][1]
                sends[p] = (r, c, S.copy(r, p, scratch[p][0], data, (hi - lo) * item,
                                         [prev[r], prev[p]]))
            for p, (r, c, m) in sends.items():
                lo, hi = bounds[c]
                last = s == n - 2
                out = final(p, c) if last else scratch[p][1]
                own = sends.get((p + 1) % n)
                prev[p] = S.combine(p, fn, dt, hi - lo, scratch[p][0], src(p, c), out,
                                    [m, own[2] if own else None])
                if last and avg:
                    prev[p] = S.scale(p, dt, hi - lo, out)
                if last:
                    done[p] = prev[p]
        return done

    def _ring_ag(self, S: _Schedule, bounds, buf, have, dt: DType) -> None:
        n, item = self.size, dt.itemsize
        last = list(have)
        for s in range(n - 1):
            new = [None] * n
            for r in range(n):
                p, c = (r + 1) % n, (r - s) % n
                lo, hi = bounds[c]
                if hi == lo:
                    continue
                new[p] = S.copy(r, p, buf(p, c), buf(r, c), (hi - lo) * item, [last[r]])
            last = new

    def _all_reduce_ring(self, S: _Schedule, calls) -> None:
        n, c0 = self.size, calls[0]
        dt, item = c0.dtype, c0.dtype.itemsize
        if n == 1:
            self._single(S, calls, c0.count * item)
            return
        bounds = _bounds(c0.count, n)
        send = [c.send for c in calls]
        recv = [c.recv for c in calls]
        done = self._ring_rs(S, calls, bounds, lambda r, c: send[r] + bounds[c][0] * item,
                             lambda r, c: recv[r] + bounds[c][0] * item, REDUCTIONS[c0.reduction],
                             dt, c0.reduction == "avg")
        self._ring_ag(S, bounds, lambda r, c: recv[r] + bounds[c][0] * item, done, dt)

    def _all_reduce_tree(self, S: _Schedule, calls) -> None:
        n, c0 = self.size, calls[0]
        dt, nbytes = c0.dtype, c0.count * c0.dtype.itemsize
        if n == 1:
            self._single(S, calls, nbytes)
            return
        recv = [c.recv for c in calls]
        stage = [self._scratch_for(r, nbytes)[0] for r in range(n)]
        last = [S.local(c.rank, c.recv, c.send, nbytes) if c.send != c.recv else None for c in calls]
        fn = REDUCTIONS[c0.reduction]
        for level in _tree_levels(n):
            for child, parent in level:
                m = S.copy(child, parent, stage[parent], recv[child], nbytes, [last[child], last[parent]])
                last[parent] = S.combine(parent, fn, dt, c0.count, recv[parent], stage[parent],
                                         recv[parent], [m])
        if c0.reduction == "avg":
            last[0] = S.scale(0, dt, c0.count, recv[0], [])
        self._tree_down(S, recv, last, nbytes, lambda v: v)

    def _tree_down(self, S: _Schedule, recv, last, nbytes: int, rank_of) -> None:
        for level in reversed(_tree_levels(self.size)):
            for child, parent in level:
                a, b = rank_of(parent), rank_of(child)
                last[b] = S.copy(a, b, recv[b], recv[a], nbytes, [last[a]])

    def _single(self, S: _Schedule, calls, nbytes: int) -> None:
        for c in calls:
            if c.send != c.recv:
                S.local(c.rank, c.recv, c.send, nbytes)

    def _broadcast_tree(self, S: _Schedule, calls) -> None:
        n, c0 = self.size, calls[0]
        nbytes, root = c0.count * c0.dtype.itemsize, c0.root
        recv = [c.recv for c in calls]
        last = [None] * n
        if calls[root].send != recv[root]:
            last[root] = S.local(root, recv[root], calls[root].send, nbytes)
        self._tree_down(S, recv, last, nbytes, lambda v: (v + root) % n)

    def _broadcast_ring(self, S: _Schedule, calls) -> None:
        n, c0 = self.size, calls[0]
        item, root = c0.dtype.itemsize, c0.root
        nbytes = c0.count * item
        recv = [c.recv for c in calls]
        first = None
        if calls[root].send != recv[root]:
            first = S.local(root, recv[root], calls[root].send, nbytes)
        step = max(item, int(self.facts["chunk_bytes"]) // item * item)
        for lo in range(0, nbytes, step):
            size = min(step, nbytes - lo)
            have = first
            for v in range(n - 1):
                a, b = (root + v) % n, (root + v + 1) % n
                have = S.copy(a, b, recv[b] + lo, recv[a] + lo, size, [have])

    def _all_gather(self, S: _Schedule, calls) -> None:
        n, c0 = self.size, calls[0]
        item, count = c0.dtype.itemsize, c0.count
        bounds = [(r * count, (r + 1) * count) for r in range(n)]
        recv = [c.recv for c in calls]
        have = [S.local(c.rank, recv[c.rank] + c.rank * count * item, c.send, count * item)
                if c.send != recv[c.rank] + c.rank * count * item else None for c in calls]
        self._ring_ag(S, bounds, lambda r, c: recv[r] + bounds[c][0] * item, have, c0.dtype)

    def _reduce_scatter(self, S: _Schedule, calls) -> None:
        n, c0 = self.size, calls[0]
        dt, item, count = c0.dtype, c0.dtype.itemsize, c0.count
        if n == 1:
            self._single(S, calls, count * item)
            return
        bounds = [(r * count, (r + 1) * count) for r in range(n)]
        send = [c.send for c in calls]
        recv = [c.recv for c in calls]
        self._ring_rs(S, calls, bounds, lambda r, c: send[r] + bounds[c][0] * item,
                      lambda r, c: recv[r], REDUCTIONS[c0.reduction], dt, c0.reduction == "avg")

    def _all_to_all(self, S: _Schedule, calls) -> None:
        n, c0 = self.size, calls[0]
        chunk = c0.count * c0.dtype.itemsize
        for c in calls:
            r = c.rank
            S.local(r, c.recv + r * chunk, c.send + r * chunk, chunk)
            for k in range(1, n):                # staggered: rank r starts with rank r+1
                j = (r + k) % n
                S.copy(r, j, calls[j].recv + r * chunk, c.send + j * chunk, chunk)

    # -- report -----------------------------------------------------------------------------------
    def report(self) -> dict:
        return {"name": self.name, "ranks": self.size, "devices": list(self.devices),
                "topology": None if self.topology is None else self.topology.kind,
                "timeout_s": self.timeout_s, "aborted": None if self.aborted is None
                else self.aborted.to_dict(),
                "collectives": [r.to_dict() for r in self.records]}


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _bounds(count: int, n: int) -> list[tuple[int, int]]:
    """Chunk c of ``count`` elements split over ``n`` ranks: ``np.array_split``'s bounds."""
    q, rem = divmod(count, n)
    out, lo = [], 0
    for c in range(n):
        hi = lo + q + (1 if c < rem else 0)
        out.append((lo, hi))
        lo = hi
    return out


def _tree_levels(n: int) -> list[list[tuple[int, int]]]:
    """Binomial tree rooted at rank 0: per level, the (child, parent) pairs."""
    levels, k = [], 0
    while (1 << k) < n:
        step = 1 << k
        levels.append([(i + step, i) for i in range(0, n, 2 * step) if i + step < n])
        k += 1
    return levels


def _reduction_program(name: str, kind: str, fn, dtype: DType, n: int, group_size: int):
    """``out = a fn b`` (``combine``) or ``out = a / fn`` (``div`` by the rank count) over
    ``n`` elements: one pointwise ISA kernel with a counted cost estimate."""
    kb = KernelBuilder(name)
    dt = dtype.value
    pa = kb.param("a", "ptr", dt)
    pb = kb.param("b", "ptr", dt) if kind == "combine" else None
    po = kb.param("out", "ptr", dt)
    block = min(_BLOCK, next_pow2(n))
    flat = kb.iadd(kb.imul(kb.pid(0), block), kb.arange(block))
    mask = kb.binary("lt", flat, kb.const(n, "int64"))
    x = kb.emit(isa.Load(kb.reg(), pa, flat, mask))
    if kind == "combine":
        y = kb.emit(isa.Load(kb.reg(), pb, flat, mask))
        res = kb.binary(fn, x, y)
    else:
        res = kb.binary("div", x, kb.const(float(fn), dt))
    kb.emit(isa.Store(po, flat, res, mask))
    grid = (math.ceil(n / block), 1, 1)
    program = kb.program(group_size=group_size, kind="pointwise", block=block,
                         registers=POINTWISE_REGISTERS, shared_memory=0)
    est = static_counters(program, grid, {mask: n})
    nbytes = n * dtype.itemsize
    est.update(kind="counters", read={p: [0, nbytes] for p in (pa, pb) if p},
               write={po: [0, nbytes]})
    program.meta["estimate"] = est
    return program, grid


__all__ = ["BUS_FACTOR", "COLLECTIVES", "CollectiveRecord", "Communicator", "RankComm", "Work"]
