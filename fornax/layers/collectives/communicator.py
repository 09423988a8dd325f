"""The communicator (NCCL/RCCL/oneCCL-like): ``N`` ranks over simulated devices of one stack.

A :class:`Communicator` joins ``N`` devices of one stack, one *rank* per device.
Each rank has its own runtime context and an in-order stream on its device,
plus one send queue per peer (NCCL's channels): a peer copy runs on the
fabric link (``Topology.egress``) its queue's packets name, so copies to
different peers can overlap where the fabric has several links.
``comm.rank(r)`` (a :class:`RankComm`) makes rank ``r``'s calls; each
returns a :class:`Work`.

**Ordering rules.**  Every rank must issue the same collectives in the same
order.  ``comm.rank(r).all_reduce(...)`` enqueues rank ``r``'s call; a
collective executes once every rank's oldest pending call is the same one
(same op, count, dtype, reduction, root and algorithm); a send executes with
its peer's matching recv.  The schedule each collective runs is
:mod:`.algorithms`'; its time, :mod:`.schedule`'s; what it reports,
:mod:`.record`'s.  Calls that disagree, or a rank that never makes its
call, leave the other ranks blocked, as on real hardware: when the host
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

from dataclasses import dataclass
from typing import Any, Iterable, Protocol, SupportsInt

import numpy as np
from numpy.typing import NDArray

from ...sim.faults import PageFault
from ...sim.isa import Program
from ...sim.timeline import Packet, Semaphore, Timeline
from ...sim.topology import Topology
from ..binary import KernelBinary, ShippedImage
from ..driver import Context, Marker, Queue
from ..errors import ErrorTable, FornaxError
from ..ir import DType
from ..runtime import NON_BLOCKING, Runtime, Stream
from .algorithms import builder, choose
from .calls import COLLECTIVES, Call, Signature
from .kernels import KernelKey, reduction_program
from .record import BUS_FACTOR, CollectiveRecord
from .schedule import KernelEntry, Schedule

#: a collective data type: a DType or its name (``"float32"``)
DTypeName = str | DType


class CollectiveLibrary(Protocol):
    """What a communicator needs of the library that creates it (``LibraryBase`` has it)."""

    @property
    def vendor(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def runtime(self) -> Runtime: ...
    @property
    def facts(self) -> dict[str, Any]: ...
    @property
    def group_size(self) -> int: ...

    def build(self, programs: list[Program], fmt: str, target: str) -> KernelBinary:
        """Pack kernels into one shipped image of ``fmt`` for ``target``."""
    def _image_for(self, target: str, loadable: tuple[str, ...]) -> ShippedImage:
        """The shipped image (``format``, ``target``) a device of ``target`` loads."""


@dataclass(eq=False)
class Work:
    """A rank's handle on one of its calls (like ``torch.distributed``'s ``Work``)."""

    comm: Communicator
    rank: int
    call: Call

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

    def __init__(self, comm: Communicator, rank: int) -> None:
        self.comm, self.index = comm, rank

    def all_reduce(self, send: int, recv: int, count: int, dtype: DTypeName = "float32", op: str = "sum",
                   algorithm: str | None = None) -> Work:
        """``recv = op over ranks of send`` (``count`` elements; ``send == recv`` is in place)."""
        return self.comm._post(self.index, "all_reduce", send, recv, count, dtype, reduction=op,
                               algorithm=algorithm)

    def all_gather(self, send: int, recv: int, count: int, dtype: DTypeName = "float32") -> Work:
        """``recv[r*count:(r+1)*count] = send of rank r`` (``count`` elements per rank)."""
        return self.comm._post(self.index, "all_gather", send, recv, count, dtype)

    def reduce_scatter(self, send: int, recv: int, count: int, dtype: DTypeName = "float32",
                       op: str = "sum") -> Work:
        """``recv = op over ranks of send[rank*count:(rank+1)*count]`` (``count`` per rank)."""
        return self.comm._post(self.index, "reduce_scatter", send, recv, count, dtype, reduction=op)

    def broadcast(self, send: int, recv: int, count: int, dtype: DTypeName = "float32", root: int = 0,
                  algorithm: str | None = None) -> Work:
        """``recv = send of rank root`` on every rank (``send`` is read on the root only)."""
        return self.comm._post(self.index, "broadcast", send, recv, count, dtype, root=root,
                               algorithm=algorithm)

    def all_to_all(self, send: int, recv: int, count: int, dtype: DTypeName = "float32") -> Work:
        """``recv[j*count:(j+1)*count] = send[rank*count:...] of rank j`` (``count`` per pair)."""
        return self.comm._post(self.index, "all_to_all", send, recv, count, dtype)

    def send(self, buf: int, count: int, dtype: DTypeName = "float32", peer: int = 0) -> Work:
        """Send ``count`` elements at ``buf`` to rank ``peer`` (it runs with the peer's recv)."""
        return self.comm._post(self.index, "send", buf, 0, count, dtype, peer=peer)

    def recv(self, buf: int, count: int, dtype: DTypeName = "float32", peer: int = 0) -> Work:
        """Receive ``count`` elements into ``buf`` from rank ``peer``."""
        return self.comm._post(self.index, "recv", 0, buf, count, dtype, peer=peer)

    def synchronize(self) -> None:
        """The host waits for every call this rank made."""
        self.comm._check_aborted()
        if self.comm._pending[self.index]:
            self.comm._watchdog([self.index])
        self.comm._sync_rank(self.index)


class Communicator:
    """``N`` ranks over devices of one stack (``library.communicator(devices)``)."""

    def __init__(self, library: CollectiveLibrary, devices: Iterable[SupportsInt] | None = None,
                 timeout_s: float | None = None) -> None:
        self.library = library
        self.runtime = library.runtime
        self.driver = self.runtime.driver
        facts: dict[str, Any] | None = library.facts["library"].get("collectives")
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
        requested: Iterable[SupportsInt] = list(range(count)) if devices is None else devices
        shown: object = requested
        chosen: list[int] = []
        try:
            chosen = [int(d) for d in requested]
            shown = chosen
            ok = all(0 <= d < count for d in chosen) and len(set(chosen)) == len(chosen)
        except (TypeError, ValueError):
            ok = False
        if not ok or not chosen:
            raise self.error("invalid_argument", f"a communicator needs distinct device indices "
                             f"in 0..{count - 1}, got {shown!r}", call="comm_init")
        self.devices = chosen
        self.size = len(chosen)
        timeout: object = float(facts["watchdog_s"]) if timeout_s is None else timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise self.error("invalid_argument", f"timeout_s must be a positive number of seconds, "
                             f"got {timeout_s!r}", call="comm_init")
        self.timeout_s = float(timeout)
        sim = [self.driver.devices[d] for d in chosen]
        self.topology: Topology | None = sim[0].topology
        if self.size > 1 and (self.topology is None or any(s.topology is not self.topology
                                                           for s in sim)):
            raise self.error("invalid_argument", "the devices are not joined by one fabric",
                             call="comm_init", hint="compose the stack with devices > 1")
        self.meta = any(s.meta for s in sim)
        #: each rank's runtime context, by rank
        self.contexts: list[Context] = [self.runtime.context(d) for d in chosen]
        prev = self.runtime.current_device()
        #: each rank's in-order, non-blocking stream, by rank
        self.streams: list[Stream] = []
        try:
            for d in chosen:
                self.runtime.set_device(d)
                self.streams.append(self.runtime.create_stream(NON_BLOCKING, in_order=True))
        finally:
            self.runtime.set_device(prev)
        #: the queue of each rank's stream, by rank
        self.queues: list[Queue] = [s.queue for s in self.streams]
        #: the send queues created so far, by (source rank, destination rank, channel)
        self.peer_queues: dict[tuple[int, int, int], Queue] = {}
        #: the channels each ring step is striped over (``Topology.ring_channels``: N-1 on a
        #: full mesh, where one ring would leave all but one link of each device idle)
        self.ring_channels = 1 if self.topology is None or self.size < 2 else \
            self.topology.ring_channels(chosen)
        self._scratch_buffers: dict[int, tuple[int, int]] = {}     # rank -> (address, bytes)
        self._kernels: dict[tuple[int, str, str | int, DType, int, str, str], KernelEntry] = {}
        self._pending: list[list[Call]] = [[] for _ in chosen]
        self._calls = [0] * self.size
        self._last: list[Call | None] = [None] * self.size
        self.aborted: FornaxError | None = None
        shared = getattr(library, "collective_records", None)     # the library's report lists them
        self.records: list[CollectiveRecord] = shared if isinstance(shared, list) else []
        self._watchdog_sems: list[Semaphore] = []

    # -- helpers ------------------------------------------------------------------------------
    def rank(self, r: int) -> RankComm:
        """Rank ``r``'s view, through which it makes its calls."""
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.size:
            raise self.error("invalid_argument", f"rank {r!r} is not in this {self.size}-rank "
                             f"communicator (ranks 0..{self.size - 1})", call="comm_rank")
        return RankComm(self, r)

    def call_name(self, op: str) -> str:
        """The family's name for collective ``op`` (``ncclAllReduce``, ``ccl::allreduce``, ...)."""
        name: str = self.facts["calls"].get(op, op)
        return name

    def error(self, condition: str, message: str, call: str | None = None,
              hint: str | None = None) -> FornaxError:
        """The family's error for ``condition`` (``[library.collectives.errors]``), naming
        ``call`` (or the communicator)."""
        name = self.errors.faults.get(condition) or self.errors.faults["unknown"]
        return self.errors.error(name, message, op=self.call_name(call) if call else self.name,
                                 hint=hint)

    def timeline(self, r: int) -> Timeline:
        """Rank ``r``'s device timeline."""
        return self.contexts[r].device.timeline

    def timelines(self) -> list[Timeline]:
        """Every rank's device timeline, each once."""
        return list({id(c.device.timeline): c.device.timeline for c in self.contexts}.values())

    @property
    def ring(self) -> list[int]:
        """Each rank's device index, by rank."""
        return list(self.devices)

    def peer_queue(self, src: int, dst: int, channel: int = 0) -> Queue:
        """The send queue of ``channel`` from rank ``src`` to rank ``dst`` (created on first
        use)."""
        key = (src, dst, channel)
        if key not in self.peer_queues:
            self.peer_queues[key] = self.driver.create_queue(self.contexts[src])
        return self.peer_queues[key]

    def malloc(self, r: int, nbytes: int) -> int:
        """Device memory on rank ``r``'s device (the runtime's caching allocator)."""
        prev = self.runtime.current_device()
        self.runtime.set_device(self.devices[self.rank(r).index])
        try:
            return self.runtime.malloc(nbytes)
        finally:
            self.runtime.set_device(prev)

    def upload(self, r: int, ptr: int, array: NDArray[Any]) -> None:
        """Copy ``array`` to ``ptr`` on rank ``r``, in order on the rank's stream."""
        self.runtime.memcpy_h2d(ptr, np.ascontiguousarray(array), self.streams[self.rank(r).index])

    def download(self, r: int, ptr: int, count: int, dtype: DTypeName = "float32") -> NDArray[Any]:
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

    def scratch(self, r: int, nbytes: int) -> tuple[int, int]:
        """A staging buffer and a partial-sum buffer of ``nbytes`` each on rank ``r``."""
        have = self._scratch_buffers.get(r)
        if have is None or have[1] < nbytes:
            size = max(nbytes, 256)
            if have is not None:
                prev = self.runtime.current_device()
                self.runtime.set_device(self.devices[r])
                try:
                    self.runtime.free(have[0])
                finally:
                    self.runtime.set_device(prev)
            have = self._scratch_buffers[r] = (self.malloc(r, 2 * size), size)
        return have[0], have[0] + have[1]

    # -- kernels --------------------------------------------------------------------------------
    def reduction_kernel(self, r: int, key: KernelKey) -> KernelEntry:
        """(module, entry, grid) of a reduction kernel for rank ``r``'s device (built and loaded
        on first use)."""
        kind, fn, dtype, n = key
        dev = self.devices[r]
        props = self.driver.properties(dev)
        image = self.library._image_for(props.target, self.driver.loadable_formats(dev))
        full = (dev, *key, image["format"], image["target"])
        if full not in self._kernels:
            entry = f"{self.name.replace('-', '_')}_{kind}_{fn}_{dtype.value}_{n}"
            program, grid = reduction_program(entry, kind, fn, dtype, n, self.library.group_size)
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
    def _post(self, r: int, op: str, send: int, recv: int, count: int, dtype: DTypeName,
              reduction: str | None = None, root: int | None = None, peer: int | None = None,
              algorithm: str | None = None) -> Work:
        """Check rank ``r``'s call, queue it, and run whatever now matches."""
        self._check_aborted()
        call = op
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise self.error("invalid_argument", f"rank {r}: count must be a whole number >= 0, "
                             f"got {count!r}", call=call)
        dt: DType | None
        try:
            dt = DType.of(dtype)
        except FornaxError:
            dt = None
        if dt is None or dt.value not in self.facts["dtypes"]:
            raise self.error("invalid_argument", f"rank {r}: {dtype!r} is not a collective data "
                             f"type (supported: {', '.join(self.facts['dtypes'])})", call=call)
        if reduction is not None and reduction not in self.facts["ops"]:
            raise self.error("invalid_argument", f"rank {r}: unknown reduction {reduction!r} "
                             f"(supported: {', '.join(self.facts['ops'])})", call=call)
        if reduction == "avg" and not dt.is_float:
            raise self.error("invalid_argument", f"rank {r}: avg needs a floating-point type, "
                             f"got {dt.value}", call=call)
        if root is not None and (isinstance(root, bool) or not isinstance(root, int)
                                 or not 0 <= root < self.size):
            raise self.error("invalid_argument", f"rank {r}: root {root!r} is not a rank of this "
                             f"{self.size}-rank communicator", call=call)
        if peer is not None and (isinstance(peer, bool) or not isinstance(peer, int)
                                 or not 0 <= peer < self.size or peer == r):
            raise self.error("invalid_argument", f"rank {r}: peer {peer!r} must be another rank "
                             f"of this {self.size}-rank communicator", call=call)
        algos = self.facts["algorithms"]
        if algorithm is not None and (algorithm not in algos or op not in ("all_reduce", "broadcast")):
            raise self.error("invalid_argument", f"rank {r}: algorithm {algorithm!r} is not "
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
        c = Call(r, self._calls[r], op, int(count), dt, int(send or 0), int(recv or 0),
                 reduction, root, peer, algorithm)
        self._pending[r].append(c)
        self._progress()
        return Work(self, r, c)

    def _check_buffer(self, r: int, what: str, addr: object, nbytes: int, call: str) -> None:
        if isinstance(addr, bool) or not isinstance(addr, (int, np.integer)):
            raise self.error("invalid_argument", f"rank {r}: the {what} buffer must be a device "
                             f"address, got {type(addr).__name__}", call=call)
        try:
            self.contexts[r].space.resolve(int(addr), int(nbytes), "read" if what == "send" else "write")
        except PageFault as exc:
            raise self.error("invalid_argument", f"rank {r}: the {what} buffer ({nbytes} bytes at "
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
                    peer = h.peer_rank()
                    o = heads[peer]
                    if (o is not None and o.op == "recv" and o.peer == r and o.count == h.count
                            and o.dtype == h.dtype):
                        self._pending[r].pop(0)
                        self._pending[peer].pop(0)
                        self._send_recv(h, o)
                        moved = True
                        break
            if moved:
                continue
            live = [h for h in heads if h is not None]
            if len(live) == len(heads) and all(h.op in COLLECTIVES for h in live) and \
                    len({h.signature() for h in live}) == 1:
                calls = [p.pop(0) for p in self._pending]
                self._run(calls)
                moved = True

    # -- the watchdog ------------------------------------------------------------------------------
    def _describe(self, c: Call) -> str:
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
        #: each waiting rank's oldest pending call, by rank (in rank order)
        waiting = {r: h for r, h in enumerate(heads) if h is not None}
        lines = []
        p2p = [r for r, h in waiting.items() if h.op in ("send", "recv")]
        if p2p:
            r = p2p[0]
            h = waiting[r]
            peer = h.peer_rank()
            o = heads[peer]
            want = "recv from" if h.op == "send" else "send to"
            other = (f"its oldest pending call is {self._describe(o)}" if o is not None else
                     self._idle(peer))
            lines.append(f"rank {r} waits in {self._describe(h)}; rank {peer} has no matching "
                         f"{self.call_name('recv' if h.op == 'send' else 'send')} ({want} rank {r}): "
                         f"{other}")
            condition = "missing_rank" if o is None else "mismatch"
        else:
            groups: dict[Signature, list[int]] = {}
            for r, h in waiting.items():
                groups.setdefault(h.signature(), []).append(r)
            missing = [r for r in range(self.size) if heads[r] is None]
            for sig, ranks in groups.items():
                lines.append(f"{_ranks(ranks)} wait{'s' if len(ranks) == 1 else ''} in "
                             f"{self._describe(waiting[ranks[0]])}")
            if missing:
                ref = next(iter(waiting.values()))
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

        def stuck(t: float = self.timeout_s) -> float:       # the packet's duration: the timeout
            return t

        for r in blocked:
            q = self.queues[r]
            tl = self.timeline(r)
            hwq = tl.create_queue(f"{self.name}:watchdog")
            sem = Semaphore(f"{self.name}-watchdog-rank{r}")
            self._watchdog_sems.append(sem)
            m = q.record()
            label = f"{self.call_name(self._pending[r][0].op)} blocked (watchdog)"
            hwq.submit(Packet("compute", stuck, label, "collective",
                              waits=[(m.sem, m.value)], signals=[(sem, 1)]))
            tl.wait(sem, 1)
            q.wait(Marker(sem, 1))              # the aborted kernel is gone; the stream goes on
            fired = max(fired, sem.reached_at(1) or 0.0)
        seqs = sorted({self._pending[r][0].seq for r in blocked})
        err = self.error(
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
    def _run(self, calls: list[Call]) -> None:
        c0 = calls[0]
        op, n, dt, count = c0.op, self.size, c0.dtype, c0.count
        item = dt.itemsize
        nbytes = {"all_reduce": count, "broadcast": count, "all_gather": n * count,
                  "reduce_scatter": n * count, "all_to_all": n * count}[op] * item
        algorithm, reason = choose(op, nbytes, c0.algorithm, self.devices, self.topology, self.facts)
        sched = Schedule(self)
        if count > 0:
            builder(op, algorithm)(sched, calls)
        start, end = sched.finish()
        for c in calls:
            c.done = True
            self._last[c.rank] = c
        self._record(op, count, dt, nbytes, algorithm, reason, start, end, sched,
                     c0.reduction, c0.root)

    def _record(self, op: str, count: int, dt: DType, nbytes: int, algorithm: str, reason: str,
                start: float, end: float, sched: Schedule, reduction: str | None = None,
                root: int | None = None) -> None:
        t = end - start
        algbw = nbytes / t if t > 0 else 0.0
        call = self.call_name("send") + "/" + self.call_name("recv") if op == "send_recv" else \
            self.call_name(op)
        self.records.append(CollectiveRecord(
            op, call, self.size, count, dt.value, nbytes, algorithm, reason, t, algbw,
            algbw * BUS_FACTOR[op](self.size), reduction, root, start, sched.copies, sched.kernels))

    def _send_recv(self, s: Call, r: Call) -> None:
        sched = Schedule(self)
        nbytes = s.count * s.dtype.itemsize
        if nbytes:
            sched.copy(s.rank, r.rank, r.recv, s.send, nbytes)
        start, end = sched.finish()
        s.done = r.done = True
        self._last[s.rank], self._last[r.rank] = s, r
        self._record("send_recv", s.count, s.dtype, nbytes, "p2p",
                     f"rank {s.rank} -> rank {r.rank}", start, end, sched)

    # -- report -----------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """The communicator and every collective it ran (the library report's part)."""
        return {"name": self.name, "ranks": self.size, "devices": list(self.devices),
                "topology": None if self.topology is None else self.topology.kind,
                "timeout_s": self.timeout_s, "aborted": None if self.aborted is None
                else self.aborted.to_dict(),
                "collectives": [r.to_dict() for r in self.records]}


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
