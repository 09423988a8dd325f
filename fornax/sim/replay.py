"""Record and replay: an optimisation of the interpreter for kernels launched again.

A kernel launched again over the same grid with the same scalar arguments computes
the same indices, touches the same offsets of its buffers and counts the same work;
only the buffers' contents and base addresses differ.  So the second launch of each
(program, grid, scalars) is *recorded* (:mod:`.recorder`; the first runs plainly:
many kernels run only once), and a later launch replays the tape and takes its
counters from the recording (byte ranges rebased on the pointer arguments).

A replayed load or store keeps its layout (:mod:`.lanes`): when its elements all lie
in one mapping it reads or writes that mapping directly, and anything else (a fault,
a misaligned base, an access spanning mappings) takes the general path from the same
addresses, which raises exactly what a first launch would.  A load or store at
offsets read from memory (a gather, a scatter) replays the general way and counts the
byte range it touches live; everything else it counts does not depend on the data.

The recordings live in a :class:`ReplayCache`, which a :class:`~.device.Device` owns.
It holds at most :data:`REPLAY_BYTES` of recordings (least recently used go first; a
single recording larger than an eighth of that is not kept; 0 switches replay off).
The interpreter (:mod:`.interpreter`) is the reference: a replayed launch agrees with
it bit for bit in memory, counters and faults.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
import numpy as np

from . import fastpath, isa
from .arithmetic import cast
from .counters import Counters, PriceMemo, Ranges
from .interpreter import (BINARY, UNARY, Args, Grid, Interpreter, PointerDtypes, binary_value,
                          check_arguments, chunk_instances, pointer_dtypes, reduce_value, unary_value,
                          where_value)
from .lanes import Lanes, frozen
from .memory import AddressSpace
from .recorder import DYNAMIC, PLAIN_BINARY, PLAIN_UNARY, How, Recorder, RecordingInterpreter
from .tiles import Tile, align, operand

#: bytes of static registers all of one cache's recordings together may hold (least recently
#: used recordings go first); a single recording larger than an eighth of it is not kept
REPLAY_BYTES = 64 << 20

#: fast-path kinds (:mod:`.fastpath`) whose every access is static: a launch too large to
#: record keeps its counts, and later launches take the fast path without a tape
COUNTS_ONLY = ("gemm", "scatter_add")

#: what a recording is valid for: the grid, the chunking and each scalar argument's bits
LaunchKey = tuple[Hashable, ...]


class _Replay:
    """One replayed launch: its registers, and the general interpreter when an operation
    needs it (an instruction with no fast form, a load or store the fast path cannot take)."""

    __slots__ = ("program", "space", "args", "grid", "ptr_dtype", "regs", "run", "live")

    def __init__(self, program: isa.Program, space: AddressSpace, args: Args, grid: Grid,
                 ptr_dtype: PointerDtypes):
        self.program, self.space, self.args, self.grid, self.ptr_dtype = program, space, args, grid, ptr_dtype
        self.regs: dict[str, Tile] = {}
        self.run: Interpreter | None = None
        self.live: Counters | None = None   # what the data-dependent accesses counted

    def _runner(self) -> Interpreter:
        run = self.run
        if run is None:
            run = self.run = Interpreter(self.program, self.space, self.args, Counters(),
                                         self.ptr_dtype, counting=False)
        run.regs = self.regs
        return run

    def general(self, ins: object, n: int) -> None:
        self._runner().step(ins, None, n, self.grid)

    def dynamic(self, ins: object, n: int) -> None:
        """A load or store at loaded offsets: the general way, its ranges counted into ``live``."""
        if self.live is None:
            self.live = Counters()
        run = self._runner()
        idle = run.c
        run.c, run.counting = self.live, True
        try:
            run.step(ins, None, n, self.grid)
        finally:
            run.c, run.counting = idle, False


#: a tape entry as replayed: (registers, arguments, address space, the launch) -> None
Operation = Callable[[dict[str, Tile], Args, AddressSpace, _Replay], None]


def _operation(ins: object, how: How, n: int) -> Operation:
    """A tape entry as a function doing what :meth:`Interpreter.step` does with counting
    off (the general path itself when there is no faster form).  A tape runs inside
    :meth:`ReplayCache.execute`, whose ``np.errstate`` silences floating-point warnings as
    the interpreter's own does per instruction."""
    if how == PLAIN_BINARY and isinstance(ins, isa.Binary):
        fn2, a, b, dst = BINARY[ins.fn], ins.a, ins.b, ins.dst

        def binary(regs: dict[str, Tile], args: Args, space: AddressSpace, replay: _Replay) -> None:
            x = regs[a]
            y = fn2(x, regs[b])
            regs[dst] = y if y.dtype == np.bool_ else cast(y, x.dtype)
        return binary
    if how == PLAIN_UNARY and isinstance(ins, isa.Unary):
        fn1, src, dst = UNARY[ins.fn], ins.src, ins.dst

        def unary(regs: dict[str, Tile], args: Args, space: AddressSpace, replay: _Replay) -> None:
            x = regs[src]
            y = fn1(x)
            regs[dst] = y if y.dtype == np.bool_ else cast(y, x.dtype)
        return unary
    if how == DYNAMIC:
        def dynamic(regs: dict[str, Tile], args: Args, space: AddressSpace, replay: _Replay) -> None:
            replay.dynamic(ins, n)
        return dynamic
    if how is None:
        direct = _direct(ins, n)
        if direct is not None:
            return direct
    if isinstance(how, Lanes) and isinstance(ins, isa.Load):
        return _load(ins, how)
    if isinstance(how, Lanes) and isinstance(ins, isa.Store):
        return _store(ins, how)

    def general(regs: dict[str, Tile], args: Args, space: AddressSpace, replay: _Replay) -> None:
        replay.general(ins, n)
    return general


def _direct(ins: object, n: int) -> Operation | None:
    """A binary or unary that needs alignment or widening, a where, a convert or a reduce,
    computed as :meth:`Interpreter.step` computes it (the same value functions) on a launch's
    plain registers with counting off, without its dispatch (None: the general path, which
    also reports anything wrong)."""
    if isinstance(ins, isa.Binary):
        fn, a_, b_, dst, bitwise = ins.fn, ins.a, ins.b, ins.dst, ins.fn in isa.BITWISE

        def binary(regs: dict[str, Tile], args: Args, space: AddressSpace, replay: _Replay) -> None:
            a, b = align(regs[a_], regs[b_])
            if a.dtype != b.dtype or (bitwise and a.dtype.kind not in "iu"):
                replay.general(ins, n)
                return
            try:
                regs[dst] = binary_value(fn, a, b)
            except ValueError:
                replay.general(ins, n)
        return binary
    if isinstance(ins, isa.Unary) and ins.fn != "tf32":      # the interpreter tracks tf32 registers
        fn, src, dst = ins.fn, ins.src, ins.dst

        def unary(regs: dict[str, Tile], args: Args, space: AddressSpace, replay: _Replay) -> None:
            regs[dst] = unary_value(fn, regs[src])
        return unary
    if isinstance(ins, isa.Where):
        c_, a_, b_, dst = ins.cond, ins.a, ins.b, ins.dst

        def where(regs: dict[str, Tile], args: Args, space: AddressSpace, replay: _Replay) -> None:
            regs[dst] = where_value(regs[c_], regs[a_], regs[b_])
        return where
    if isinstance(ins, isa.Convert):
        src, dst, to = ins.src, ins.dst, isa.np_dtype(ins.dtype)

        def convert(regs: dict[str, Tile], args: Args, space: AddressSpace, replay: _Replay) -> None:
            regs[dst] = operand(regs[src], to)
        return convert
    if isinstance(ins, isa.Reduce):
        fn, src, dst, at = ins.fn, ins.src, ins.dst, ins.axis

        def reduce(regs: dict[str, Tile], args: Args, space: AddressSpace, replay: _Replay) -> None:
            x = regs[src]
            if not -x.ndim + 1 <= at < x.ndim - 1:
                replay.general(ins, n)          # the interpreter says what is wrong
                return
            regs[dst] = reduce_value(fn, x, at)
        return reduce
    return None


def _load(ins: isa.Load, how: Lanes) -> Operation:
    """A load with a static layout: index the one mapping that holds it, directly."""
    ptr, isz, lo, end = how.ptr, how.itemsize, how.lo, how.hi + how.itemsize
    dtype, start, count, index, mask, shape = how.dtype, how.start, how.count, how.index, how.mask, how.shape
    box, dst, other = how.box, ins.dst, ins.other

    def load(regs: dict[str, Tile], args: Args, space: AddressSpace, replay: _Replay) -> None:
        base = int(args[ptr])
        m = None if base % isz else space.holding(base + lo, base + end)
        if m is None:                   # misaligned, spanning mappings or faulting
            got = space.gather(how.addresses(base), dtype)
        elif index is not None:
            got = space.elements(m, dtype)[index + (base - m.va) // isz]
        else:
            first = base - m.va + start * isz
            view = (space.box(m, dtype, (first, (count,), (isz,))) if box is None
                    else space.box(m, dtype, (first,) + box))
            got = view.copy().reshape(-1)
        if mask is None:
            regs[dst] = got.reshape(shape)
        else:
            values = np.full(shape, other, dtype=dtype)
            values[mask] = got
            regs[dst] = values
    return load


def _store(ins: isa.Store, how: Lanes) -> Operation:
    """A store with a static layout: write the one mapping that holds it, directly."""
    ptr, isz, lo, end = how.ptr, how.itemsize, how.lo, how.hi + how.itemsize
    dtype, start, count, index, mask, shape = how.dtype, how.start, how.count, how.index, how.mask, how.shape
    box, src, vshape = how.box, ins.value, how.vshape

    def store(regs: dict[str, Tile], args: Args, space: AddressSpace, replay: _Replay) -> None:
        value = regs[src]
        if value.shape != vshape:
            value = value.reshape(vshape)
        value = cast(value, dtype)
        if value.shape != shape:
            value = np.broadcast_to(value, shape)
        values = value[mask] if mask is not None else np.ascontiguousarray(value).ravel()
        base = int(args[ptr])
        m = None if base % isz else space.holding(base + lo, base + end)
        # registers are never written in place, so a deferred write may keep ``values``
        if m is None:
            space.scatter(how.addresses(base), values)
        elif index is not None:
            space.store_elements(m, dtype, index + (base - m.va) // isz, values, owned=True)
        elif box is None:
            off = (base - m.va) // isz + start
            space.store_elements(m, dtype, slice(off, off + count), values, owned=True)
        else:
            space.store_box(m, dtype, (base - m.va + start * isz,) + box, values.reshape(box[0]))
    return store


class _Recording:
    """One replayable launch: its tape per chunk and its counters (ranges relative to the
    pointer arguments).  With data-dependent accesses (``dynamic``), a range is what the
    static accesses touched (None if none did) joined with what the replay counts live."""

    __slots__ = ("chunks", "counters", "read_rel", "write_rel", "read_part", "write_part", "nbytes",
                 "pricing", "dynamic", "tape")

    def __init__(self, rec: Recorder, counters: Counters, args: Args, tape: bool = True):
        #: False: only the counts of a launch whose tape was too large to keep (a kernel with a
        #: fast path, which needs no tape; when the fast path declines, the launch is interpreted)
        self.tape = tape
        self.counters = counters
        self.dynamic = rec.dynamic
        #: static recordings: per touched pointer, its range relative to the pointer
        self.read_rel: list[tuple[str, int, int]] = []
        self.write_rel: list[tuple[str, int, int]] = []
        #: dynamic recordings: per touched pointer (in the order touched, which does not depend
        #: on the data), what its static accesses touched relative to the pointer, or None
        self.read_part: list[tuple[str, tuple[int, int] | None]] = []
        self.write_part: list[tuple[str, tuple[int, int] | None]] = []
        if rec.dynamic:
            self.read_part = [(k, rec.static_ranges.get((False, k))) for k in counters.read_ranges]
            self.write_part = [(k, rec.static_ranges.get((True, k))) for k in counters.write_ranges]
        else:
            self.read_rel = [(k, lo - int(args[k]), hi - int(args[k]))
                             for k, (lo, hi) in counters.read_ranges.items()]
            self.write_rel = [(k, lo - int(args[k]), hi - int(args[k]))
                              for k, (lo, hi) in counters.write_ranges.items()]
        for _, entries in rec.chunks:
            for entry in entries:
                for arr in entry.statics.values():
                    frozen(arr)
        self.nbytes = rec.nbytes if tape else 0
        #: per chunk, the tape as (static registers to bind, operation) pairs
        self.chunks = [[(entry.statics, _operation(entry.ins, entry.how, n)) for entry in entries]
                       for n, entries in rec.chunks]
        self.pricing: PriceMemo = {}    # the device's kernel prices of this work (see Device)

    def counted(self, args: Args, live: Counters | None) -> Counters:
        """The recorded counts for a launch with ``args``; ``live``: the ranges the replay's
        data-dependent accesses touched."""
        c = self.counters
        out = Counters(c.instances, dict(c.matrix_flops), dict(c.vector_flops), c.bytes_read,
                       c.bytes_written, c.instructions, {}, {})
        if self.dynamic:
            seen = live or Counters()
            for table, parts, touched in ((out.read_ranges, self.read_part, seen.read_ranges),
                                          (out.write_ranges, self.write_part, seen.write_ranges)):
                _join(table, parts, touched, args)
        else:
            for table, rel in ((out.read_ranges, self.read_rel), (out.write_ranges, self.write_rel)):
                for k, lo, hi in rel:
                    base = int(args[k])
                    table[k] = (base + lo, base + hi)
        out.pricing = self.pricing      # the same work, priced once per footprint
        return out


def _join(table: Ranges, parts: list[tuple[str, tuple[int, int] | None]], touched: Ranges,
          args: Args) -> None:
    """Per pointer (in the recorded order): the static part rebased on its argument, joined
    with what the live accesses ``touched``."""
    for k, part in parts:
        got = touched.get(k)
        if part is not None:
            base = int(args[k])
            lo, hi = base + part[0], base + part[1]
            got = (lo, hi) if got is None else (min(got[0], lo), max(got[1], hi))
        if got is None:   # pragma: no cover - a pointer the recording touched is touched again
            raise AssertionError(f"replay lost the range of {k!r}")
        table[k] = got


class _Program:
    """What the cache knows about one program: chunk size, pointer dtypes, scalar
    parameters; and the keys of its recordings (dropped when the program is)."""

    __slots__ = ("ref", "chunk", "ptr_dtype", "names", "scalars", "keys", "skip", "seen")

    def __init__(self, program: isa.Program, ref: weakref.ref[isa.Program]):
        self.ref = ref
        self.chunk: int | None = None   # instances per chunk (worked out at the first launch)
        self.ptr_dtype = pointer_dtypes(program)
        self.names = tuple(p.name for p in program.params)
        self.scalars = tuple((p.name, p.dtype) for p in program.params if p.kind == "scalar")
        self.keys: set[LaunchKey] = set()   # this program's recordings held in the cache
        self.skip: set[LaunchKey] = set()   # keys found not replayable (or too large to keep)
        self.seen: set[LaunchKey] = set()   # keys launched once: the second launch records


class ReplayCache:
    """The replay recordings of one owner (a :class:`~.device.Device`), bounded in bytes.

    ``limit``: the bytes all recordings together may hold (default :data:`REPLAY_BYTES`
    as it is when the cache is made; 0 switches replay off: every launch is interpreted).
    Programs are known by identity while they live (a :class:`~.isa.Program` is a frozen
    dataclass whose hash walks its whole body); a program's recordings go with it."""

    def __init__(self, limit: int | None = None, fast: bool = True):
        self.limit = REPLAY_BYTES if limit is None else limit
        #: whether a replayed launch of a kernel with a fast path (:mod:`.fastpath`) takes it
        self.fast = fast
        #: launches by how they ran: interpreted plainly, interpreted while recording, replayed
        #: from a recording (its tape), and replayed by a fast path
        self.interpreted = self.recorded = self.replayed = self.fast_launches = 0
        self.nbytes = 0                 # what the recordings held now take
        self._programs: dict[int, _Program] = {}
        self._recordings: OrderedDict[tuple[int, LaunchKey], _Recording] = OrderedDict()

    def __len__(self) -> int:
        """How many recordings are held now."""
        return len(self._recordings)

    def stats(self) -> dict[str, int | bool]:
        """How the launches so far ran (what a report shows: replay never changes a result,
        only the host time it takes)."""
        return {"replay": self.limit > 0, "interpreted": self.interpreted, "recorded": self.recorded,
                "replayed": self.replayed + self.fast_launches, "fast_path": self.fast_launches}

    def recordings(self, program: isa.Program) -> int:
        """How many recordings of ``program`` are held now (one per grid and scalars)."""
        info = self._programs.get(id(program))
        if info is None or info.ref() is not program:
            return 0
        return sum((id(program), key) in self._recordings for key in info.keys)

    def clear(self) -> None:
        """Forget every recording (the next launch of each kernel records again)."""
        self._recordings.clear()
        self.nbytes = 0
        for info in self._programs.values():
            info.keys.clear()
            info.skip.clear()
            info.seen.clear()

    def _info(self, program: isa.Program) -> _Program | None:
        """What the cache knows about ``program``; None when it cannot be weakly referenced
        (it then runs plainly and nothing about it is kept)."""
        pid = id(program)
        info = self._programs.get(pid)
        if info is not None and info.ref() is program:
            return info
        forget = weakref.WeakMethod(self._forget)
        held: list[_Program] = []

        def gone(_ref: weakref.ref[isa.Program]) -> None:
            owner = forget()
            if owner is not None and held:
                owner(pid, held[0])

        try:
            ref = weakref.ref(program, gone)
        except TypeError:
            return None
        info = self._programs[pid] = _Program(program, ref)
        held.append(info)
        return info

    def _forget(self, pid: int, info: _Program) -> None:
        """A program was collected: drop what the cache held about it."""
        if self._programs.get(pid) is info:
            del self._programs[pid]
        for key in info.keys:
            rec = self._recordings.pop((pid, key), None)
            if rec is not None:
                self.nbytes -= rec.nbytes

    def _keep(self, pid: int, info: _Program, key: LaunchKey, recording: _Recording) -> None:
        self._recordings[(pid, key)] = recording
        info.keys.add(key)
        self.nbytes += recording.nbytes
        while self.nbytes > self.limit and self._recordings:
            (old_pid, old_key), old = self._recordings.popitem(last=False)
            self.nbytes -= old.nbytes
            owner = self._programs.get(old_pid)
            if owner is not None:
                owner.keys.discard(old_key)

    @staticmethod
    def _launch_key(info: _Program, grid: Grid, chunk: int, args: Args) -> LaunchKey | None:
        """What a recording is valid for: the grid (plain ints), the chunking, and every scalar
        argument as the interpreter sees it (shape and exact bits); None when there is nothing
        safe to key on (the launch then runs, and fails if it must, the general way)."""
        if any(type(g) is not int for g in grid):
            return None
        if not info.scalars:
            return grid, chunk
        try:
            key: list[Hashable] = [grid, chunk]
            for name, dt in info.scalars:
                value = np.array([args[name]], dtype=isa.np_dtype(dt))
                key.append((value.shape, value.tobytes()))
            return tuple(key)
        except Exception:
            return None

    def execute(self, program: isa.Program, grid: Grid, args: Args, space: AddressSpace) -> Counters:
        """Run ``program`` over ``grid`` in ``space`` with ``args``: replayed when a recording
        of the launch is held, recorded at a launch's second time, interpreted otherwise."""
        with np.errstate(all="ignore"):
            return self._execute(program, grid, args, space)

    def _interpret(self, program: isa.Program, grid: Grid, args: Args, space: AddressSpace,
                   ptr_dtype: PointerDtypes, chunk: int) -> Counters:
        """The launch through the interpreter, plainly (no recording)."""
        self.interpreted += 1
        counters = Counters(instances=grid[0] * grid[1] * grid[2])
        Interpreter(program, space, args, counters, ptr_dtype).launch(grid, chunk)
        return counters

    def _execute(self, program: isa.Program, grid: Grid, args: Args, space: AddressSpace) -> Counters:
        info = self._info(program) if self.limit > 0 else None
        names = info.names if info is not None else tuple(p.name for p in program.params)
        check_arguments(program, names, args)
        gx, gy, gz = grid
        grid = (gx, gy, gz)
        if info is None:
            return self._interpret(program, grid, args, space, pointer_dtypes(program),
                                   chunk_instances(program))
        if info.chunk is None:
            info.chunk = chunk_instances(program)
        chunk = info.chunk
        key = self._launch_key(info, grid, chunk, args)
        pid = id(program)
        if key is not None:
            recording = self._recordings.get((pid, key))
            if recording is not None:
                self._recordings.move_to_end((pid, key))
                fast = program.meta.get("fast") if self.fast else None
                if fast is not None:
                    live = fastpath.run(fast, grid, args, space, info.ptr_dtype)
                    if live is not None:
                        self.fast_launches += 1
                        return recording.counted(args, live)
                if recording.tape:
                    self.replayed += 1
                    return _replay(program, recording, grid, args, space, info.ptr_dtype)
                # counts only, and the fast path declined
                return self._interpret(program, grid, args, space, info.ptr_dtype, chunk)
        # a key's first launch runs plainly (many kernels run once); its second one records
        if key is None or key in info.skip or key not in info.seen:
            if key is not None and key not in info.skip:
                if len(info.seen) >= 256:
                    info.seen.clear()
                info.seen.add(key)
            return self._interpret(program, grid, args, space, info.ptr_dtype, chunk)
        counters = Counters(instances=gx * gy * gz)
        self.recorded += 1
        recorder = Recorder(self.limit // 8)     # one recording: at most an eighth of all
        RecordingInterpreter(program, space, args, counters, info.ptr_dtype, recorder).launch(
            grid, chunk)
        if recorder.ok:
            self._keep(pid, info, key, _Recording(recorder, counters, args))
        elif recorder.too_large and not recorder.dynamic and \
                (program.meta.get("fast") or {}).get("kind") in COUNTS_ONLY:
            # a tape too large to keep (a big GEMM's tile offsets, a scatter's update loop):
            # its fast path needs only the counts, which depend on the grid and scalars alone
            self._keep(pid, info, key, _Recording(recorder, counters, args, tape=False))
        elif len(info.skip) < 64:
            info.skip.add(key)
        return counters


def _replay(program: isa.Program, recording: _Recording, grid: Grid, args: Args,
            space: AddressSpace, ptr_dtype: PointerDtypes) -> Counters:
    replay = _Replay(program, space, args, grid, ptr_dtype)
    for tape in recording.chunks:
        regs = replay.regs = {}
        for statics, operation in tape:
            if statics:
                regs.update(statics)
            operation(regs, args, space, replay)
    if replay.run is not None and replay.run.pending:
        replay.run.flush_reductions()
    return recording.counted(args, replay.live)

