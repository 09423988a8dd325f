"""Static shape and dtype checking of ISA programs: what a finaliser does before anything launches.

:func:`fornax.sim.isa.verify` checks that a program is well formed (known instructions,
registers written before they are read, parameters of the right kind).  :func:`check_types`
goes further: it infers the tile shape and dtype of every register from the declared
parameters and the instructions, with the executor's own rules (tile dimensions aligned to
the right and broadcast the numpy way; the instance axis always broadcasts), and refuses a
program that could not run: tile shapes that do not broadcast, operand dtypes that differ, a
reshape that changes the element count, a matrix product of tiles that do not chain, offsets
that are not integers, a reduction axis the tile does not have, a loop bound that is not one
value.  The refusal is an :class:`IllTypedProgram` (an :class:`InvalidProgram`) naming the
kernel, the instruction and the shapes / dtypes that do not fit, so a driver reports it as a
build error at module load instead of a launch failure.

The checker is exact for what the executor accepts: a register whose type depends on how many
times a loop with a run-time bound runs is *unknown*, and nothing that reads an unknown
register is refused on its account.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NoReturn

import numpy as np

from . import isa
from .faults import InvalidProgram

#: functions numpy does not define on bool tiles (the executor would raise a TypeError)
_NOT_ON_BOOL = frozenset({"neg", "sigmoid", "sign", "sub"})
#: loop iterations simulated before registers that still change are given up as unknown
_LOOP_ROUNDS = 4
_INT64 = np.dtype(np.int64)
_BOOL = np.dtype(np.bool_)
_NAMES = {dt: name for name, dt in isa.DTYPES.items()}

#: a tile shape (without the instance axis)
Shape = tuple[int, ...]
#: what the checker knows of a register: its tile shape and dtype
TileType = tuple[Shape, np.dtype[Any]]
#: register -> its type, None when unknown (it changes around a loop)
Env = dict[str, TileType | None]


class IllTypedProgram(InvalidProgram):
    """A program whose tile shapes or dtypes do not fit: refused when its module is built."""


def _name(dt: np.dtype[Any]) -> str:
    return _NAMES.get(dt, str(dt))


def _fmt(t: TileType) -> str:
    shape, dt = t
    return f"{_name(dt)}[{', '.join(str(d) for d in shape)}]"


def _broadcast(*shapes: Shape) -> Shape | None:
    """numpy broadcasting of right-aligned tile shapes; None when they do not broadcast."""
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        size = 1
        for s in shapes:
            k = axis - (rank - len(s))
            if k < 0:
                continue
            d = s[k]
            if d != 1:
                if size != 1 and size != d:
                    return None
                size = d
        out.append(size)
    return tuple(out)


class _Checker:
    def __init__(self, program: isa.Program):
        self.program = program
        self.params = {p.name: p for p in program.params}

    def fail(self, path: str, ins: object, msg: str) -> NoReturn:
        op = getattr(ins, "op", "?")
        what = op if not hasattr(ins, "fn") else f"{op} {getattr(ins, 'fn')}"
        raise IllTypedProgram(f"kernel {self.program.name!r}, instruction {path} ({what}): {msg}")

    def body(self, body: Iterable[object], env: Env, prefix: str) -> None:
        for i, ins in enumerate(body):
            path = f"{prefix}{i}"
            if isinstance(ins, isa.Loop):
                self.loop(ins, env, path)
            else:
                t = self.step(ins, env, path)
                dst = getattr(ins, "dst", None)
                if dst is not None:
                    env[dst] = t

    def read(self, env: Env, reg: str, ins: object, path: str) -> TileType | None:
        if reg not in env:
            self.fail(path, ins, f"reads register {reg} before it is written")
        return env[reg]

    def step(self, ins: Any, env: Env, path: str) -> TileType | None:
        """The type (shape, dtype) ``ins`` writes, None when unknown; raise when it cannot run."""
        t = type(ins)
        if t is isa.ProgramId:
            return (), _INT64
        if t is isa.Arange:
            return (ins.n,), _INT64
        if t is isa.Const:
            return (), isa.np_dtype(ins.dtype)
        if t is isa.ScalarArg:
            return (), isa.np_dtype(self.params[ins.param].dtype)
        if t is isa.Barrier:
            return None
        reads = {n: self.read(env, getattr(ins, n), ins, path) for n in _OPERANDS[t]
                 if getattr(ins, n) is not None}
        if t is isa.Convert:
            x = reads["src"]
            return None if x is None else (x[0], isa.np_dtype(ins.dtype))
        if any(v is None for v in reads.values()):
            return None                  # reads an unknown register: nothing to check, or to say
        result: TileType | None = getattr(self, "_" + ins.op)(ins, path, **reads)
        return result

    # ---- one method per instruction, named after its op --------------------------------
    def _unary(self, ins: isa.Unary, path: str, src: TileType) -> TileType:
        shape, dt = src
        if dt == _BOOL and ins.fn in _NOT_ON_BOOL:
            self.fail(path, ins, f"{ins.fn} is not defined on bool tiles ({_fmt(src)}); convert first")
        return shape, (_BOOL if ins.fn in isa.BOOL_RESULT else dt)

    def _binary(self, ins: isa.Binary, path: str, a: TileType, b: TileType) -> TileType:
        if a[1] != b[1]:
            self.fail(path, ins, f"operand dtypes differ ({_fmt(a)} vs {_fmt(b)}); insert a convert")
        if ins.fn in isa.BITWISE and a[1].kind not in "iu":
            self.fail(path, ins, f"bit operation {ins.fn} needs integer tiles, got {_fmt(a)}")
        if a[1] == _BOOL and ins.fn in _NOT_ON_BOOL:
            self.fail(path, ins, f"{ins.fn} is not defined on bool tiles ({_fmt(a)}); convert first")
        shape = _broadcast(a[0], b[0])
        if shape is None:
            self.fail(path, ins, f"tile shapes of {ins.a} {_fmt(a)} and {ins.b} {_fmt(b)} do not broadcast")
        return shape, (_BOOL if ins.fn in isa.BOOL_RESULT else a[1])

    def _where(self, ins: isa.Where, path: str, cond: TileType, a: TileType, b: TileType) -> TileType:
        shape = _broadcast(cond[0], a[0], b[0])
        if shape is None:
            self.fail(path, ins, f"tile shapes of {ins.cond} {_fmt(cond)}, {ins.a} {_fmt(a)} and "
                                 f"{ins.b} {_fmt(b)} do not broadcast")
        try:
            dt = np.result_type(a[1], b[1])
        except TypeError:
            self.fail(path, ins, f"no common dtype for {_fmt(a)} and {_fmt(b)}; insert a convert")
        return shape, dt

    def _reshape(self, ins: isa.Reshape, path: str, src: TileType) -> TileType:
        if math.prod(src[0]) != math.prod(ins.shape):
            self.fail(path, ins, f"cannot reshape {ins.src} {_fmt(src)} ({math.prod(src[0])} elements) "
                                 f"to {tuple(ins.shape)} ({math.prod(ins.shape)} elements)")
        return tuple(ins.shape), src[1]

    def _broadcast(self, ins: isa.Broadcast, path: str, src: TileType) -> TileType:
        shape, target = src[0], tuple(ins.shape)
        if len(shape) > len(target) or any(
                d not in (1, e) for d, e in zip(shape, target[len(target) - len(shape):])):
            self.fail(path, ins, f"cannot broadcast {ins.src} {_fmt(src)} to {target}")
        return target, src[1]

    def _reduce(self, ins: isa.Reduce, path: str, src: TileType) -> TileType:
        shape, rank = src[0], len(src[0])
        if not -rank <= ins.axis < rank:
            self.fail(path, ins, f"axis {ins.axis} out of range for {ins.src} {_fmt(src)}")
        axis = ins.axis % rank
        out = shape[:axis] + (1,) + shape[axis + 1:]
        return out, (_INT64 if ins.fn in isa.ARG_REDUCE else src[1])

    def _lanes(self, ins: isa.Load | isa.Store | isa.StoreReduce, path: str, offsets: TileType,
               mask: TileType | None) -> Shape:
        if offsets[1].kind not in "iu":
            self.fail(path, ins, f"offsets {ins.offsets} must be an integer tile, got {_fmt(offsets)}")
        if mask is None:
            return offsets[0]
        shape = _broadcast(offsets[0], mask[0])
        if shape is None:
            self.fail(path, ins, f"offsets {ins.offsets} {_fmt(offsets)} and mask {ins.mask} "
                                 f"{_fmt(mask)} do not broadcast")
        return shape

    def _load(self, ins: isa.Load, path: str, offsets: TileType, mask: TileType | None = None) -> TileType:
        return self._lanes(ins, path, offsets, mask), isa.np_dtype(self.params[ins.ptr].dtype)

    def _store(self, ins: isa.Store | isa.StoreReduce, path: str, offsets: TileType, value: TileType,
               mask: TileType | None = None) -> None:
        lanes = self._lanes(ins, path, offsets, mask)
        if _broadcast(lanes, value[0]) is None:
            self.fail(path, ins, f"value {ins.value} {_fmt(value)} does not broadcast to the lanes "
                                 f"{lanes} of offsets {ins.offsets}")
        return None

    _store_reduce = _store

    def _dot(self, ins: isa.Dot, path: str, a: TileType, b: TileType, acc: TileType) -> TileType:
        return self._product(ins, path, a, b, acc, a[0][1] if len(a[0]) == 2 else -1, "K")

    def _sparse_dot(self, ins: isa.SparseDot, path: str, a: TileType, e: TileType, b: TileType,
                    acc: TileType) -> TileType:
        out = self._product(ins, path, a, b, acc, 2 * a[0][1] if len(a[0]) == 2 else -1, "K/2")
        words = -(-b[0][0] // isa.SPARSE_K_PER_WORD)
        if e[1] != np.dtype(np.int32) or tuple(e[0]) != (a[0][0], words):
            self.fail(path, ins, f"metadata {ins.e} {_fmt(e)} must be int32 [{a[0][0]}, {words}]")
        return out

    def _product(self, ins: isa.Dot | isa.SparseDot, path: str, a: TileType, b: TileType,
                 acc: TileType, k: int, cols: str) -> TileType:
        """The accumulator type of ``acc + a @ b`` where ``a`` (``[M, cols]``) stands for ``k``
        columns (its own, or twice its own for a 2:4 operand's kept values)."""
        if len(a[0]) != 2 or len(b[0]) != 2 or k != b[0][0]:
            self.fail(path, ins, f"needs [M,{cols}] x [K,N] tiles, got {ins.a} {_fmt(a)} x "
                                 f"{ins.b} {_fmt(b)}")
        out = (a[0][0], b[0][1])
        if acc[0] != out:
            self.fail(path, ins, f"accumulator {ins.acc} {_fmt(acc)} does not match the product "
                                 f"{list(out)} of {ins.a} {_fmt(a)} x {ins.b} {_fmt(b)}")
        return out, isa.np_dtype(ins.acc_dtype)

    # ---- loops ----------------------------------------------------------------------------
    def loop(self, ins: isa.Loop, env: Env, path: str) -> None:
        if isinstance(ins.stop, str):
            bound = self.read(env, ins.stop, ins, path)
            if bound is not None and math.prod(bound[0]) != 1:
                self.fail(path, ins, f"loop bound {ins.stop} {_fmt(bound)} must be one value")
            trips = None
        else:
            trips = len(range(ins.start, ins.stop, ins.step))

        def run(state: Env) -> Env:
            inner = dict(state)
            inner[ins.var] = ((), _INT64)
            self.body(ins.body, inner, f"{path}.")
            return {k: inner[k] for k in state}

        # each iteration starts from what the one before left: run to a fixed point
        state, settled = dict(env), False
        for rounds in range(1, _LOOP_ROUNDS + 1):
            after = run(state)
            settled = after == state or (trips is not None and rounds >= trips)
            last, state = state, after
            if settled:
                break
        widen = 0
        while not settled:
            # still changing: what changes is unknown from here on (only ever more unknowns)
            widen += 1
            state = {k: (v if last[k] == v and widen <= len(state) else None) for k, v in state.items()}
            after = run(state)
            settled = after == state
            last, state = state, after
        if trips == 0:
            return                       # the body never runs: the registers keep their types
        if trips is None:                # zero or more runs: a register that changes is unknown
            state = {k: (v if state[k] == v else None) for k, v in env.items()}
        env.update(state)


_OPERANDS = isa.OPERANDS


def check_types(program: isa.Program) -> isa.Program:
    """Infer every register's tile shape and dtype; raise :class:`IllTypedProgram` naming the
    first instruction whose operands do not fit.  ``program`` must already pass
    :func:`fornax.sim.isa.verify`.  Returns the program."""
    _Checker(program).body(program.body, {}, "")
    return program


def check_module(kernels: dict[str, isa.Program]) -> dict[str, isa.Program]:
    """:func:`check_types` for every kernel of a module (name -> program); one message per
    refused kernel, all in one :class:`IllTypedProgram`."""
    errors = []
    for program in kernels.values():
        try:
            check_types(program)
        except IllTypedProgram as exc:
            errors.append(f"error: {exc}")
    if errors:
        raise IllTypedProgram("\n".join(errors))
    return kernels
