"""``ProcessGroupFornax``: torch.distributed's ProcessGroup for ``fornax`` tensors.

One process per rank, each simulating its own device (as real clusters pin one process per
GPU).  A collective on a fornax tensor is an operation on the process's *communication
queue* (a stream of the active stack's runtime, like NCCL's internal stream):

1. it waits for the work already issued on the caller's current stream (its inputs);
2. when the device reaches it, it reads its inputs from simulated device memory, exchanges
   them with the other ranks (:mod:`.exchange`: real bytes over gloo, with each rank's
   arrival time), computes the result in the algorithm's summation order
   (:func:`fornax.layers.collectives.order.reduce_in_order`, bit-identical on every rank)
   and writes it into device memory;
3. it lasts until the latest rank's arrival plus the collective's cost on the fabric
   (:mod:`.timing`), so the ranks' simulated clocks line up at every collective;
4. the returned work's ``wait()`` makes the caller's current stream wait for it, so work
   issued before the wait overlaps the communication (:class:`FornaxWork`).

Collectives are issued on one queue per process in program order, which every rank shares,
so their exchanges match up.  A peer that never joins (a dead process, a skipped call) makes
the exchange fail (at once when its process is gone, else after the group's timeout): the
operation fails with the family's collective error (``ncclRemoteError``-like) naming the op,
its sequence number, the rank and the ranks that never reached it (a flight recorder in the
store), and every later wait on the device sees it.  A rank whose device or link fails under
a collective announces it in the exchange, so every rank fails that same collective.  A
future (``get_future``, DDP's buckets) defers its tensors instead of waiting
(:mod:`..hazards`).  Each collective is recorded (op, the family's call name, bytes,
algorithm, simulated time, bus bandwidth) in :meth:`report`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.futures import Future

from ....layers.collectives.order import ArrayOps, reduce_in_order
from ....layers.errors import ErrorTable, FornaxError
from ....layers.runtime import NON_BLOCKING
from ....sim.faults import SimError
from ....sim.topology import Topology
from .. import hazards
from .. import tensors as T
from ..session import TAG_SHIFT, current
from ..streams import current_runtime_stream
from .exchange import Arrival, Exchange, ExchangeError, RemoteFailure
from .host_tensors import HostGroup, serve_host_tensors
from .timing import BUS, Priced, price

BACKEND = "fornax"
#: the timeline engine collectives run on (a peer engine: the fabric, not the compute units)
ENGINE = "peer-collectives"

REDUCE_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.PRODUCT: "product",
              dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max", dist.ReduceOp.BAND: "band",
              dist.ReduceOp.BOR: "bor", dist.ReduceOp.BXOR: "bxor"}


def _average(x: torch.Tensor, n: int) -> torch.Tensor:
    if x.dtype.is_floating_point or x.dtype.is_complex:
        return (x / n).to(x.dtype)
    return torch.div(x, n, rounding_mode="floor")


TORCH_OPS = ArrayOps(
    combine={"sum": torch.add, "avg": torch.add, "max": torch.maximum, "min": torch.minimum,
             "product": torch.mul, "band": torch.bitwise_and, "bor": torch.bitwise_or,
             "bxor": torch.bitwise_xor},
    concat=torch.cat, average=_average)


class FornaxWork(dist._Work):
    """The handle of one collective: ``wait()`` (and ``synchronize()``, ``get_future()``) makes
    the caller's current stream wait for the collective's operation, so work issued between
    the call and the wait overlaps the communication on the simulated timeline, as with NCCL's
    internal stream.  torch calls ``wait()`` itself for a synchronous collective."""

    def __init__(self, pg: "ProcessGroupFornax", outputs: list[torch.Tensor], done: Any,
                 copies: list[tuple[torch.Tensor, torch.Tensor]], inputs: list[torch.Tensor]):
        super().__init__()
        self._pg, self._outputs, self._done, self._copies = pg, outputs, done, copies
        # the inputs' memory must not go back to the caching allocator (and be handed to work
        # on another stream) before the collective has read it: held until the caller's stream
        # waits for it (what ProcessGroupNCCL does with recordStream)
        self._inputs: list[torch.Tensor] | None = inputs
        self._waited = False

    def wait(self, timeout: Any = None) -> bool:
        if not self._waited:
            self._waited = True
            session = self._pg.session
            with session.lock:
                session.runtime.stream_wait_event(current_runtime_stream(session), self._done)
            for out, tmp in self._copies:          # a non-contiguous output gets its values now
                out.copy_(tmp)
            self._inputs = None
        return True

    def synchronize(self) -> None:
        self.wait()

    def block_current_stream(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        return self._waited

    def is_success(self) -> bool:
        return True

    def result(self) -> list[torch.Tensor]:
        return self._outputs

    def get_future(self) -> Future:
        # torch's Future cannot make a stream wait on a fornax event (the Python device guard
        # has no events): the tensors are deferred instead, and the first op that touches
        # them waits for the collective (DDP's backward runs on meanwhile); a non-contiguous
        # output still needs its copy-back, so that one waits now
        if self._waited or self._copies:
            self.wait()
        else:
            hazards.defer(self._pg.session, [*self._outputs, *(self._inputs or [])], self._done,
                          keep=[*self._outputs, *(self._inputs or [])])
        fut: Future = Future()
        fut.set_result(self._outputs)
        return fut


class CollectiveFailed(SimError):
    """A collective's exchange with the other ranks failed (the device op fails with it).

    Waiting on a peer that failed or never came is what a collective kernel does until the
    watchdog fires: a ``hang``.  A rank's own fault under the collective keeps its kind (a
    lost device, a failed link), so the driver reports the family's code for it."""

    kind = "hang"

    def __init__(self, error: FornaxError, kind: str | None = None):
        super().__init__(str(error))
        self.error = error
        if kind is not None:
            self.kind = kind


def _host(data: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Bytes as a 1-D CPU tensor of ``dtype`` (a copy)."""
    return torch.frombuffer(bytearray(data.tobytes()), dtype=torch.uint8).view(dtype) if data.size \
        else torch.empty(0, dtype=dtype)


def _size(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the tensors' elements."""
    return sum(t.numel() * t.element_size() for t in tensors)


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)


@serve_host_tensors
class ProcessGroupFornax(dist.ProcessGroup):
    """A torch.distributed process group over the ranks' simulated devices (CPU tensors on
    it travel over gloo, :mod:`.host_tensors`)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self.session = current()
        stack = self.session.stack
        lib = stack.vendors["library"]
        facts = lib.facts["library"].get("collectives")
        if not facts:
            raise FornaxError(f"the {lib.name} library has no collectives: no torch.distributed "
                              "backend on this stack", seam="library", vendor=lib.name)
        self.facts: dict[str, Any] = facts
        e = facts["errors"]
        self.errors = ErrorTable(e["api"], e["codes"], e["conditions"], seam="library", vendor=lib.name)
        self.family = lib.name
        #: the backend name the family's PyTorch face registers (nccl, nccl as RCCL poses, xccl)
        self.face_backend = stack.framework.facts["framework"].get("dist_backend")
        self.timeout = timeout
        # torchrun keeps its store across restarts: the keys of an earlier attempt's transports
        # would name listeners that are gone, so each attempt has its own
        store = dist.PrefixStore(f"attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
        self.exchange = Exchange(store, rank, size, timeout)
        self.host = HostGroup(store, rank, size, timeout)
        #: each member's node: torchrun runs LOCAL_WORLD_SIZE ranks per node, so global rank g
        #: is on node g // LOCAL_WORLD_SIZE; members on different nodes talk over the NIC tier
        self.members, self.node_of = self._members(size)
        self.topology = (Topology.build(stack.spec, size, stack.config.topology, self.node_of)
                         if size > 1 else None)
        runtime = self.session.runtime
        self.stream = runtime.create_stream(NON_BLOCKING, in_order=True)
        self.context = runtime.context()
        # collectives run on the device's fabric engine, beside kernels and DMA copies (a peer
        # engine of the timeline: what the links, not the compute units, are busy with)
        timeline = self.context.device.timeline
        if ENGINE not in timeline.engines:
            timeline.add_engine(ENGINE)
        self.seq = 0
        self._closed = False
        self.records: list[dict[str, Any]] = []
        self._name = ""
        self._desc = ""

    def _members(self, size: int) -> tuple[list[int], list[int]]:
        """The members' global ranks and their nodes, by group rank."""
        mine = int(os.environ.get("RANK", self.rank()))
        if size == 1:
            return [mine], [0]
        per = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", size))))
        got = self.exchange.all_gather(np.asarray([mine], dtype=np.int64).view(np.uint8), 0.0,
                                       "the group's members and their nodes")
        members = [int(a.data.view(np.int64)[0]) for a in got]
        return members, [g // per for g in members]

    # -- names: c10d registers the group under the name it sets here, and functional
    # collectives, DTensor and DeviceMesh find it by ``group_name`` (a Python subclass keeps
    # its own: the C++ base's setter does not reach a Python group's getter) ----------------------
    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    def _set_group_name(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    @property
    def group_name(self) -> str:
        if not self._name:
            raise RuntimeError("ProcessGroup name not set")
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    @property
    def group_desc(self) -> str:
        return self._desc

    def call_name(self, op: str) -> str:
        return str(self.facts["calls"].get(op, op))

    # -- the one path every collective takes ---------------------------------------------------
    def _error(self, condition: str, message: str, op: str, hint: str | None = None) -> FornaxError:
        name = self.errors.faults.get(condition) or self.errors.faults["unknown"]
        return self.errors.error(name, message, op=self.call_name(op), hint=hint)

    def _check(self, tensors: Sequence[torch.Tensor], op: str) -> None:
        for t in tensors:
            if not T.is_fornax(t):
                raise self._error("invalid_argument", f"the {BACKEND} backend takes fornax tensors "
                                  f"(or CPU tensors only, over gloo), got one on {t.device}", op,
                                  hint="pass the collective tensors of one device")
            if t.numel() and (t.untyped_storage().data_ptr() >> TAG_SHIFT) != self.session.id:
                raise self._error("invalid_argument", "the tensor lives on another fornax stack than "
                                  "the one this group was made on", op,
                                  hint="make the group (dist.new_group, the DeviceMesh) after "
                                       "fornax.frameworks.torch.use_stack(), on the stack its tensors use")

    def _run(self, op: str, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
             compute: Callable[[list[list[Arrival]]], list[np.ndarray]], nbytes: int,
             exchange: Callable[[list[np.ndarray], float, str], list[list[Arrival]]] | None = None,
             priced: Priced | None = None, **where: Any) -> dist.Work:
        """Enqueue ``op``: read ``inputs``, exchange, ``compute`` the outputs' bytes from every
        rank's inputs (``[input][rank]``), write ``outputs``; priced for ``nbytes``."""
        self._check([*inputs, *outputs], op)
        hazards.before_use(self.session, inputs, outputs)    # a deferred earlier collective
        self.seq += 1
        seq = self.seq
        ins = [t.contiguous() for t in inputs]
        outs = [o if o.is_contiguous() else torch.empty_like(o, memory_format=torch.contiguous_format)
                for o in outputs]
        session = self.session
        caller = current_runtime_stream(session)
        src = [(T.address(t, session), _size([t])) for t in ins]
        dst = [(T.address(t, session), _size([t])) for t in outs]
        space, device = self.context.space, self.context.device
        priced = priced or price(self.topology, self.facts, op, nbytes, rank=self.rank(), **where)
        call = self.call_name(op)
        what = f"{call} (seq {seq}, rank {self.rank()} of {self.size()})"
        move = exchange or self._all_gather

        def work() -> float:
            tl = device.timeline
            now = tl.now
            own = None
            try:                      # the fabric is the device's too: a lost device, a failed link
                device.begin("peer", f"{call} seq {seq}")
            except SimError as exc:
                own = exc
                self.exchange.failure = f"{exc}"
            mine = [np.frombuffer(space.read(a, n), dtype=np.uint8) if n else np.empty(0, np.uint8)
                    for a, n in src] if own is None else [np.empty(0, np.uint8) for _ in src]
            self.exchange.enter(seq, call)
            try:
                got = move(mine, now, what)
            except RemoteFailure as exc:
                if own is not None:
                    raise CollectiveFailed(self._error("device_error", f"{what} failed on this rank: {own}", op,
                                                       hint="the other ranks fail this collective too; "
                                                            "restart from the last checkpoint"),
                                           own.kind) from None
                raise CollectiveFailed(self._error("remote_failure", f"{what} failed: {exc}", op,
                                                   hint="restart the job from the last checkpoint "
                                                        "(torchrun --max-restarts)")) from None
            except ExchangeError as exc:
                raise CollectiveFailed(self._error(
                    "missing_rank", f"{what} failed: {exc}; {self._behind(seq)}", op,
                    hint="a peer rank failed or exited (see its own error), or issued other "
                         "collectives: every rank must make the same calls in the same order")) from None
            finally:
                self.exchange.failure = None
            if own is not None:       # a point-to-point exchange carries no announcement
                raise CollectiveFailed(self._error("device_error", f"{what} failed on this rank: {own}", op),
                                       own.kind)
            results = compute(got)
            for (a, n), data in zip(dst, results):
                if n:
                    space.write(a, data[:n].tobytes())
            start = max([now, *(x.at for part in got for x in part)])
            # who arrived last (for the merged trace's stragglers): on a world-wide exchange the
            # arrivals are indexed by rank; a point-to-point one has its peer's only
            ats = [x.at for x in got[0]] if got else []
            last = self.rank() if len(ats) != self.size() or max(ats) <= now else \
                max(range(len(ats)), key=ats.__getitem__)
            last = self.members[last]             # the global rank (torchrun's RANK)
            tl.annotate(reads=[(a, a + n, "in") for a, n in src], writes=[(a, a + n, "out") for a, n in dst],
                        collective=call, seq=seq, bytes=nbytes, algorithm=priced.algorithm,
                        group=self._name, arrived_s=now, latest_s=start, waited_s=start - now,
                        last_rank=last)
            self._record(op, call, seq, nbytes, priced, start)
            return (start - now) + priced.seconds

        with session.lock:
            # through the runtime: the caller's event holds what its stream was told to wait
            # for (stream_wait_event) and every queue of an out-of-order pool
            runtime = session.runtime
            runtime.stream_wait_event(self.stream, runtime.record_event(caller))
            self.stream.queue.enqueue(work, f"{call} seq {seq} {nbytes}B", "collective", engine=ENGINE)
            done = runtime.record_event(self.stream)
        return FornaxWork(self, list(outputs), done, [(o, t) for o, t in zip(outputs, outs) if t is not o],
                          [*inputs, *ins])

    def _record(self, op: str, call: str, seq: int, nbytes: int, priced: Any, start: float) -> None:
        n = self.size()
        factor = BUS.get(op, lambda _: 1.0)(n) if n > 1 else 0.0
        algbw = nbytes / priced.seconds if priced.seconds > 0 else 0.0
        self.records.append({"seq": seq, "op": op, "call": call, "bytes": nbytes,
                             "algorithm": priced.algorithm, "reason": priced.reason,
                             "start_s": start, "simulated_s": priced.seconds,
                             "algbw_gbps": algbw / 1e9, "busbw_gbps": algbw * factor / 1e9})

    def _all_gather(self, mine: list[np.ndarray], at: float, what: str) -> list[list[Arrival]]:
        return [self.exchange.all_gather(m, at, what) for m in mine] if mine else \
            [self.exchange.all_gather(np.empty(0, np.uint8), at, what)]

    def _reduce_op(self, opts: Any, op: str) -> str:
        """The reduction ``opts`` asks for (SUM when it names none), by its fornax name."""
        opts_op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
        # a ReduceOp compares equal to its RedOpType but does not hash like it
        name = next((n for k, n in REDUCE_OPS.items() if opts_op == k), None)
        if name is None:
            raise self._error("invalid_argument", f"reduction {opts_op} is not supported by the "
                              f"{BACKEND} backend", op, hint="use SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR or BXOR")
        return name

    def _reduced(self, parts: list[Arrival], dtype: torch.dtype, name: str, algorithm: str) -> np.ndarray:
        xs = [_host(p.data, dtype) for p in parts]
        out = reduce_in_order(xs, name, "tree" if algorithm == "tree" else "ring", TORCH_OPS)
        return _bytes(out)

    # -- collectives -------------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        name = self._reduce_op(opts, "all_reduce")
        nbytes = _size(tensors)
        priced = price(self.topology, self.facts, "all_reduce", nbytes)     # the algorithm sums in its order
        dtypes = [t.dtype for t in tensors]
        return self._run("all_reduce", tensors, tensors,
                         lambda got: [self._reduced(g, d, name, priced.algorithm) for g, d in zip(got, dtypes)],
                         nbytes, priced=priced)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        root = int(getattr(opts, "rootRank", 0))
        nbytes = _size(tensors)
        return self._run("broadcast", tensors, tensors, lambda got: [g[root].data for g in got], nbytes,
                         root=root)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        root = int(getattr(opts, "rootRank", 0))
        name = self._reduce_op(opts, "reduce")
        nbytes = _size(tensors)
        dtypes = [t.dtype for t in tensors]
        me = self.rank()

        def compute(got: list[list[Arrival]]) -> list[np.ndarray]:
            return [self._reduced(g, d, name, "tree") if me == root else g[me].data
                    for g, d in zip(got, dtypes)]
        return self._run("reduce", tensors, tensors, compute, nbytes, root=root)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> dist.Work:
        outs = [o for per in output_tensors for o in per]
        nbytes = _size(outs)
        return self._run("all_gather", input_tensors, outs,
                         lambda got: [g[r].data for g in got for r in range(self.size())], nbytes)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self.allgather_into_tensor_coalesced([output], [input], opts)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        nbytes = _size(outputs)
        return self._run("all_gather", inputs, outputs,
                         lambda got: [np.concatenate([p.data for p in g]) for g in got], nbytes)

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = None) -> dist.Work:
        name = self._reduce_op(opts, "reduce_scatter")
        me = self.rank()
        flat = [per[r] for per in input_tensors for r in range(self.size())]
        nbytes = _size(flat)
        n = self.size()

        def compute(got: list[list[Arrival]]) -> list[np.ndarray]:
            # input j of the flat list is (output i, chunk r): reduce chunk ``me`` of each output
            return [self._reduced(got[i * n + me], output_tensors[i].dtype, name, "ring")
                    for i in range(len(output_tensors))]
        return self._run("reduce_scatter", flat, output_tensors, compute, nbytes)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self.reduce_scatter_tensor_coalesced([output], [input], opts)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        name = self._reduce_op(opts, "reduce_scatter")
        me = self.rank()

        def compute(got: list[list[Arrival]]) -> list[np.ndarray]:
            out = []
            for g, o in zip(got, outputs):
                c = _size([o])
                out.append(self._reduced([Arrival(p.data[me * c:(me + 1) * c], p.at) for p in g], o.dtype,
                                         name, "ring"))
            return out
        return self._run("reduce_scatter", inputs, outputs, compute,
                         _size(inputs))

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> dist.Work:
        n, me = self.size(), self.rank()
        row = input.element_size() * math.prod(input.shape[1:])      # bytes of one row of dim 0
        splits = list(input_split_sizes) or [input.shape[0] // n if input.dim() else 0] * n
        head = np.asarray(splits, dtype=np.int64).view(np.uint8)

        def compute(got: list[list[Arrival]]) -> list[np.ndarray]:
            pieces = []
            for part in got[0]:
                their = part.data[:8 * n].view(np.int64)
                off = 8 * n + int(their[:me].sum()) * row
                pieces.append(part.data[off:off + int(their[me]) * row])
            return [np.concatenate(pieces) if pieces else np.empty(0, np.uint8)]

        def move(mine: list[np.ndarray], at: float, what: str) -> list[list[Arrival]]:
            return [self.exchange.all_gather(np.concatenate([head, mine[0]]), at, what)]
        return self._run("all_to_all", [input], [output], compute,
                         _size([input]), exchange=move)

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> dist.Work:
        me = self.rank()
        nbytes = _size(input_tensors)
        # flat input list: input j goes to rank j; output r comes from rank r's input ``me``
        return self._run("all_to_all", input_tensors, output_tensors,
                         lambda got: [got[me][r].data for r in range(self.size())], nbytes)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> dist.Work:
        root, me = int(getattr(opts, "rootRank", 0)), self.rank()
        ins = [t for per in input_tensors for t in per] if me == root else []
        nbytes = _size(output_tensors[:1]) * self.size()

        def move(mine: list[np.ndarray], at: float, what: str) -> list[list[Arrival]]:
            return [self.exchange.all_gather(np.concatenate(mine) if mine else np.empty(0, np.uint8), at, what)]

        def compute(got: list[list[Arrival]]) -> list[np.ndarray]:
            c = _size(output_tensors[:1])
            return [got[0][root].data[me * c:(me + 1) * c]]
        return self._run("scatter", ins, output_tensors, compute, nbytes, exchange=move, root=root)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> dist.Work:
        root, me = int(getattr(opts, "rootRank", 0)), self.rank()
        outs = [o for per in output_tensors for o in per] if me == root else []
        nbytes = _size(input_tensors[:1]) * self.size()
        return self._run("gather", input_tensors, outs,
                         lambda got: [p.data for p in got[0]] if me == root else [], nbytes, root=root)

    def barrier(self, opts: Any = None) -> dist.Work:
        def move(mine: list[np.ndarray], at: float, what: str) -> list[list[Arrival]]:
            self.exchange.flush(what)            # every send posted before it has arrived
            return self._all_gather(mine, at, what)
        work = self._run("barrier", [], [], lambda got: [], 4, exchange=move)
        work.wait()
        with self.session.lock:
            self.session.runtime.stream_synchronize(current_runtime_stream(self.session))
        return work

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int = 0) -> dist.Work:  # noqa: N803
        nbytes = _size(tensors)

        def move(mine: list[np.ndarray], at: float, what: str) -> list[list[Arrival]]:
            self.exchange.send(np.concatenate(mine) if mine else np.empty(0, np.uint8), at, dstRank, tag, what)
            return [[Arrival(np.empty(0, np.uint8), at)]]
        return self._run("send", tensors, [], lambda got: [], nbytes, exchange=move, peer=dstRank)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int = 0) -> dist.Work:  # noqa: N803
        nbytes = _size(tensors)
        sizes = [_size([t]) for t in tensors]

        def move(mine: list[np.ndarray], at: float, what: str) -> list[list[Arrival]]:
            return [[self.exchange.recv(srcRank, tag, what)]]

        def compute(got: list[list[Arrival]]) -> list[np.ndarray]:
            data, out, off = got[0][0].data, [], 0
            for n in sizes:
                out.append(data[off:off + n])
                off += n
            return out
        # the receiver reads nothing of its own; its outputs are the tensors
        return self._run("recv", [], tensors, compute, nbytes, exchange=move, peer=srcRank)

    # the names distributed_c10d calls on a ProcessGroup (the C++ ones dispatch to a backend)
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._allgather_base(output, input, opts)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> dist.Work:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> dist.Work:
        return self.allgather(output_lists, inputs, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> dist.Work:
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def _behind(self, seq: int) -> str:
        """The flight recorder's view of a failed collective: the ranks that never reached it."""
        try:
            late = self.exchange.behind(seq)
        except Exception as exc:       # the store went with a dead launcher: say so, keep the error
            return f"the other ranks' progress is unknown ({type(exc).__name__})"
        if not late:
            return "every rank entered it"
        return "; ".join(f"rank {self.members[r]} " + (f"is at seq {last} ({call})" if last is not None
                                                         else "entered no collective")
                         for r, last, call in late)

    def abort(self) -> None:
        """Close this rank's transports (``ncclCommAbort``-like): ranks waiting on it fail now
        with the family's remote error instead of waiting for the timeout."""
        self.exchange.abort()
        self.host.abort()

    def shutdown(self) -> None:
        """``destroy_process_group``: finish what this rank issued before the transports go.
        The simulated device runs collectives only when someone waits, so a rank that ends
        right after a send would otherwise leave its peer's receive without data: the
        communication queue is drained and every posted send is received first.  A failure
        there was already reported to whoever waited; shutting down does not raise it again."""
        if self._closed:
            return
        self._closed = True
        try:
            with self.session.lock:
                self.session.runtime.stream_synchronize(self.stream)
            self.exchange.flush("shutting the group down")
        except (FornaxError, SimError, ExchangeError):
            pass

    # -- what happened ----------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """This rank's collectives: the family's library, each call, and totals."""
        return {"backend": BACKEND, "face_backend": self.face_backend, "library": self.facts["name"],
                "family": self.family,
                "rank": self.rank(), "world_size": self.size(), "members": list(self.members),
                "node_of": list(self.node_of),
                "topology": self.topology.summary() if self.topology is not None else None,
                "calls": len(self.records), "bytes": sum(r["bytes"] for r in self.records),
                "simulated_s": sum(r["simulated_s"] for r in self.records),
                "collectives": list(self.records)}
