"""The collectives of a ``shard_map`` body, lowered to the stack library's collectives.

Inside a body (a program built for one device of the mesh, :mod:`.shard_map`) each
collective primitive is one :class:`Collective` instruction.  When a device's
program reaches it, it yields a request; once every device of the mesh has reached
the same equation, :func:`run_exchange` runs it on the library's communicators
(NCCL/RCCL/oneCCL-like, :mod:`fornax.layers.collectives`): one communicator per
group of devices the collective joins (those that agree on every mesh axis the
collective does not name), its ranks in the order of the named axes.  The data
really moves between the simulated devices and the time comes from the
topology, on each device's timeline.

| jax primitive | library call |
|---|---|
| ``psum`` (``psum_invariant``), ``pmax``, ``pmin`` | all-reduce (sum, max, min), one per operand |
| ``all_gather`` (``all_gather_invariant``) | all-gather; a gather along a dimension other than 0 is a transpose after it, on the device |
| ``psum_scatter`` (``reduce_scatter``) | reduce-scatter (sum); a scatter dimension other than 0 is a transpose before it |
| ``all_to_all`` | all-to-all; a split axis other than 0 is a transpose before it, a concat axis other than 0 one after it |
| ``ppermute`` | one send/recv per pair of the permutation, each on a two-rank communicator of its pair (so the pairs overlap); a device nobody sends to gets zeros, as in jax |
| ``pbroadcast`` | broadcast from the source |

``axis_index`` is a constant in each device's compiled segment; ``pvary`` (the
varying-value marker of ``check_vma``) moves nothing.  Reductions take the
library's collective data types (``[library.collectives] dtypes``); data
movement takes any device dtype whose bytes split into them.  Each device's
stream waits for the collective's communication stream (and the communication
stream for the device's earlier work), so the collective's cost is on the
device's timeline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

from ...layers.graph import DType
from . import lowering as L
from .mesh import MeshLayout
from .pjrt import Buffer, Client, DevicePlacement, JaxDeviceError
from .program import INSTRUCTIONS, Builder, Flat, Program, Yields, build_program, device_address

#: the reduction of each all-reducing primitive
REDUCE = {"psum": "sum", "psum_invariant": "sum", "pmax": "max", "pmin": "min"}
#: jax's collective primitives fornax does not lower (a body that uses one is refused)
UNSUPPORTED = ("ragged_all_to_all", "psend", "precv", "all_gather_reduced", "unreduced_psum",
               "unreduced_reduce_scatter", "preduced", "vary_unreduced_cast_p", "reduced_vary_cast_p",
               "all_gather_start", "all_gather_done", "all_gather_reduced_start", "psum_start",
               "psum_done", "psum_invariant_start", "unreduced_psum_start", "reduce_scatter_start",
               "reduce_scatter_done", "unreduced_reduce_scatter_start", "all_to_all_start",
               "all_to_all_done", "pbroadcast_start", "pbroadcast_done", "ppermute_start",
               "ppermute_done")
#: the collective primitives that become library calls, and all the ones fornax lowers
CALLS = (*REDUCE, "all_gather", "all_gather_invariant", "reduce_scatter", "all_to_all", "ppermute", "pbroadcast")
LOWERED = (*CALLS, "axis_index", "pvary")


@dataclass(frozen=True)
class Part:
    """One operand's flat call: the result's aval, the library data type and the count in
    the call's convention (per rank for all-gather, per pair for all-to-all, per result
    for reduce-scatter and all-reduce)."""

    aval: Any
    dtype: str
    count: int


@dataclass(frozen=True)
class Exchange:
    """One collective equation as the devices run it on the library."""

    primitive: str
    call: str                           # all_reduce | all_gather | reduce_scatter | all_to_all | broadcast | permute
    axes: tuple[str, ...]               # the mesh axes each group spans, major first
    parts: tuple[Part, ...]
    reduction: str | None = None
    perm: tuple[tuple[int, int], ...] = ()
    root: int = 0

    def __str__(self) -> str:
        return f"{self.primitive} over {', '.join(map(repr, self.axes))}"


@dataclass(eq=False)
class Request:
    """What a device's program yields at a collective: the equation and its operands."""

    eqn: Any
    exchange: Exchange
    operands: list

    def __str__(self) -> str:
        return str(self.exchange)


@dataclass(eq=False)
class Collective:
    """A collective equation in one device's program: optional device-side layout programs
    around the library call the mesh's devices make together."""

    eqn: Any
    ins: list
    outs: list
    exchange: Exchange
    pre: Program | None                 # lays the operand out for the call
    post: Program | None                # lays the call's result out as the equation's
    route = "collective"
    yields = True

    def run(self, prog: Program, env: dict) -> Yields:
        vals = [prog.buffer(env, a) for a in self.ins]
        if self.pre is not None:
            vals = self.pre.run(vals)
        res = yield Request(self.eqn, self.exchange, vals)
        if self.post is not None:
            res = self.post.run(res)
        for r, b in zip(self.outs, res):
            env[r] = b

    def describe(self, indent: str) -> str:
        ex = self.exchange
        how = "send/recv pairs" if ex.call == "permute" else ex.call.replace("_", "-")
        return f"{indent}collective {ex} -> the library's {how}"


# ---- building ------------------------------------------------------------------------------------
def _fail(name: str, why: str, hint: str) -> JaxDeviceError:
    return JaxDeviceError(f"{name} in a shard_map body: {why}", seam="framework", op=name, hint=hint)


def _axes(name: str, names: Any, env: dict[str, tuple[int, int]]) -> tuple[str, ...]:
    axes = tuple(names) if isinstance(names, (tuple, list)) else (names,)
    for a in axes:
        if not isinstance(a, str):
            raise _fail(name, f"axis {a!r} is a positional (vmap) axis, not a mesh axis",
                        "name a mesh axis of the shard_map")
        if a not in env:
            raise _fail(name, f"axis {a!r} is not an axis of the shard_map's mesh (its axes: "
                              f"{', '.join(map(repr, env))})", "name one of the mesh's axes")
    return axes


def _dtypes(placement: DevicePlacement, name: str) -> dict[str, DType]:
    library = placement.client.stack.library
    own: Any = getattr(library, "facts", None) or {}       # a library's facts (LibraryBase has them)
    facts = own.get("library", {}).get("collectives")
    if not facts:
        raise _fail(name, f"library {library.name} has no collectives", "compose a stack whose "
                    "library has a [library.collectives] table")
    return {d: DType.of(d) for d in facts["dtypes"]}


def _reduce_type(name: str, aval, dtypes: dict[str, DType], reduction: str) -> str:
    c = L.carried(aval.dtype)
    ok = c is not None and not L.is_key(aval.dtype) and c.dtype.value in dtypes and \
        (not c.carried or reduction != "sum")
    if not ok:
        raise _fail(name, f"the library's collectives reduce {', '.join(dtypes)}, not "
                          f"{aval.str_short()}", "cast the operand to one of those types first")
    assert c is not None
    return c.dtype.value


def _carrier(name: str, aval, nbytes: int, dtypes: dict[str, DType]) -> tuple[str, int]:
    """(library data type, element count) that moves ``nbytes`` of ``aval``'s device bytes."""
    if L.carried(aval.dtype) is None:
        raise _fail(name, f"{aval.str_short()} has no fornax device dtype", "move a real-valued "
                    "array (the real and imaginary parts apart), or run the function with jax.jit")
    if L.is_key(aval.dtype):
        raise _fail(name, f"{aval.str_short()} is a PRNG key array", "move jax.random.key_data(key) "
                    "and wrap it again with jax.random.wrap_key_data")
    own = L.device_dtype_of(aval.dtype)
    if own.value in dtypes:
        return own.value, nbytes // own.itemsize
    for dt in sorted(dtypes.values(), key=lambda d: -d.itemsize):
        if nbytes % dt.itemsize == 0:
            return dt.value, nbytes // dt.itemsize
    raise _fail(name, f"{aval.str_short()} does not split into the library's collective types "
                      f"({', '.join(dtypes)})", "cast the operand to int32 or float32 first")


def _elements(aval: Any) -> int:
    return int(np.prod(aval.shape, dtype=np.int64))


def _shaped(shape, dtype) -> Any:
    return jax.core.ShapedArray(tuple(int(d) for d in shape), dtype)


def _layout(builder: Builder, what: str, fn: Callable, aval) -> Program:
    """A device program that lays a value out (a transpose and a reshape)."""
    closed = jax.make_jaxpr(fn)(jax.ShapeDtypeStruct(tuple(aval.shape), aval.dtype))
    return build_program(builder.client, closed, f"{builder.name}_{what}", builder.axes)


def _blocks_first(shape: tuple[int, ...], axis: int, n: int) -> Callable:
    """x -> the ``n`` blocks of ``x`` along ``axis``, stacked along a new leading axis."""
    split = shape[:axis] + (n, shape[axis] // n) + shape[axis + 1:]
    return lambda x: jnp.moveaxis(x.reshape(split), axis, 0)


def _blocks_joined(axis: int, out_shape: tuple[int, ...]) -> Callable:
    """The ``n`` stacked blocks -> joined along ``axis`` (the leading axis major)."""
    return lambda g: jnp.moveaxis(g, 0, axis).reshape(out_shape)


def _instruction(builder: Builder, e: Flat) -> Collective:
    eqn, name, p = e.eqn, e.eqn.primitive.name, e.eqn.params
    env = builder.axes
    placement = builder.client
    if env is None or not isinstance(placement, DevicePlacement):
        raise JaxDeviceError(f"{name} outside a shard_map body: it names mesh axes no device "
                             "program is bound to", seam="framework", op=name,
                             hint="use collectives inside jax.shard_map (or jax.pmap)")
    if p.get("axis_index_groups") is not None:
        raise _fail(name, "axis_index_groups is not supported", "split the mesh into more axes and "
                    "name the one the groups run along")
    dtypes = _dtypes(placement, name)
    x: Any = eqn.invars[0].aval
    out: Any = eqn.outvars[0].aval
    pre = post = None
    if name in REDUCE:
        axes = _axes(name, p["axes"], env)
        parts = tuple(Part(v.aval, _reduce_type(name, v.aval, dtypes, REDUCE[name]), _elements(v.aval))
                      for v in eqn.outvars)
        ex = Exchange(name, "all_reduce", axes, parts, reduction=REDUCE[name])
    elif name in ("all_gather", "all_gather_invariant"):
        axes = _axes(name, p["axis_name"], env)
        n, dim = int(p["axis_size"]), int(p["all_gather_dimension"])
        gathered = out if dim == 0 else _shaped((n, *x.shape), out.dtype)
        if dim:
            post = _layout(builder, f"{name}_post", _blocks_joined(dim, tuple(out.shape))
                           if p["tiled"] else (lambda g: jnp.moveaxis(g, 0, dim)), gathered)
        ex = Exchange(name, "all_gather", axes, (Part(gathered, *_carrier(name, x, L.device_nbytes(x), dtypes)),))
    elif name == "reduce_scatter":
        axes = _axes(name, p["axis_name"], env)
        n, dim = int(p["axis_size"]), int(p["scatter_dimension"])
        if dim:
            pre = _layout(builder, f"{name}_pre", _blocks_first(tuple(x.shape), dim, n), x)
        ex = Exchange(name, "reduce_scatter", axes,
                      (Part(out, _reduce_type(name, out, dtypes, "sum"), _elements(out)),),
                      reduction="sum")
    elif name == "all_to_all":
        axes = _axes(name, p["axis_name"], env)
        n = math.prod(env[a][1] for a in axes)
        split, concat = int(p["split_axis"]), int(p["concat_axis"])
        chunk = list(x.shape)
        chunk[split] //= n
        stacked = _shaped((n, *chunk), x.dtype)
        if split:
            pre = _layout(builder, f"{name}_pre", _blocks_first(tuple(x.shape), split, n), x)
        if concat:
            post = _layout(builder, f"{name}_post", _blocks_joined(concat, tuple(out.shape)), stacked)
        dt, count = _carrier(name, x, L.device_nbytes(x) // n, dtypes)
        ex = Exchange(name, "all_to_all", axes, (Part(stacked if concat else out, dt, count),))
    elif name == "ppermute":
        axes = _axes(name, p["axis_name"], env)
        parts = tuple(Part(v.aval, *_carrier(name, v.aval, L.device_nbytes(v.aval), dtypes))
                      for v in eqn.outvars)
        ex = Exchange(name, "permute", axes, parts, perm=tuple((int(a), int(b)) for a, b in p["perm"]))
    else:                                                    # pbroadcast
        axes = _axes(name, p["axis_name"], env)
        parts = tuple(Part(v.aval, *_carrier(name, v.aval, L.device_nbytes(v.aval), dtypes))
                      for v in eqn.outvars)
        ex = Exchange(name, "broadcast", axes, parts, root=int(p["source"]))
    return Collective(eqn, e.ins, e.outs, ex, pre, post)


def _unsupported(builder: Builder, e: Flat) -> NoReturn:
    name = e.eqn.primitive.name
    raise JaxDeviceError(
        f"{name} in a shard_map body: fornax does not lower this jax collective to the library's "
        f"collectives (it lowers {', '.join(LOWERED)})", seam="framework", op=name,
        hint="express it with those collectives, or run the function with jax.jit")


for _name in CALLS:
    INSTRUCTIONS[_name] = _instruction
for _name in UNSUPPORTED:
    INSTRUCTIONS[_name] = _unsupported


@L.lowering("axis_index")
def _axis_index(ctx: L.LowerCtx, eqn):
    names = eqn.params["axis_name"]
    names = tuple(names) if isinstance(names, (tuple, list)) else (names,)
    if ctx.axes is None or any(n not in ctx.axes for n in names):
        raise ctx.fail(f"axis {names} is not an axis of a shard_map mesh this program runs on")
    idx = 0
    for n in names:
        i, size = ctx.axes[n]
        idx = idx * size + i
    return ctx.const(np.asarray(idx), eqn.outvars[0].aval.dtype)


@L.lowering("pvary")
def _pvary(ctx: L.LowerCtx, eqn, *xs):
    return list(xs) if len(eqn.outvars) > 1 else xs[0]


# ---- running ---------------------------------------------------------------------------------------
def run_exchange(client: Client, layout: MeshLayout, placements: list[DevicePlacement],
                 requests: list[Request]) -> list[list[Buffer]]:
    """Run one collective every position of the mesh has reached: per operand, per group of
    positions, on the library; each position's results."""
    ex = requests[0].exchange
    results: list[list[Any]] = [[None] * len(ex.parts) for _ in placements]
    for j, part in enumerate(ex.parts):
        for group in layout.groups(ex.axes):
            devices = tuple(layout.devices[k] for k in group)
            pls = [placements[k] for k in group]
            sends = [requests[k].operands[j] for k in group]
            run = _permute if ex.call == "permute" else _collective
            for k, out in zip(group, run(client, ex, part, devices, pls, sends)):
                results[k][j] = out
    return results


def _enter(client: Client, comm, ranks: list[int], pls: list[DevicePlacement]) -> None:
    """Each rank's communication stream waits for the work its device's stream has before."""
    rt = client.runtime
    for r, pl in zip(ranks, pls):
        with pl.current():
            ev = rt.record_event(pl.stream)
        rt.stream_wait_event(comm.streams[r], ev)


def _leave(client: Client, comm, ranks: list[int], pls: list[DevicePlacement]) -> None:
    """Each device's stream waits for the collective on its rank's communication stream."""
    rt = client.runtime
    for r, pl in zip(ranks, pls):
        with pl.current():
            ev = rt.record_event(comm.streams[r])
        rt.stream_wait_event(pl.stream, ev)


def _noted(client: Client, ex: Exchange, comm, before: int) -> None:
    for rec in comm.records[before:]:
        client.collectives.append({"primitive": ex.primitive, "devices": list(comm.devices),
                                   **rec.to_dict()})


def _collective(client: Client, ex: Exchange, part: Part, devices: tuple[int, ...],
                pls: list[DevicePlacement], sends: list) -> list[Buffer]:
    outs = [pl.empty(part.aval) for pl in pls]
    if not outs[0].nbytes:
        return outs
    comm = client.communicator(devices)
    ranks = list(range(len(pls)))
    _enter(client, comm, ranks, pls)
    before = len(comm.records)
    for r, (send, out) in enumerate(zip(sends, outs)):
        rank = comm.rank(r)
        src, dst = device_address(send), device_address(out)
        if ex.call == "all_reduce":
            rank.all_reduce(src, dst, part.count, part.dtype, op=ex.reduction)
        elif ex.call == "reduce_scatter":
            rank.reduce_scatter(src, dst, part.count, part.dtype, op=ex.reduction)
        elif ex.call == "broadcast":
            rank.broadcast(src, dst, part.count, part.dtype, root=ex.root)
        else:
            getattr(rank, ex.call)(src, dst, part.count, part.dtype)
    _leave(client, comm, ranks, pls)
    _noted(client, ex, comm, before)
    client.counts["collectives_run"] += 1
    return outs


def _permute(client: Client, ex: Exchange, part: Part, devices: tuple[int, ...],
             pls: list[DevicePlacement], sends: list) -> list[Buffer]:
    outs: list[Any] = [None] * len(pls)
    pairs = []
    for i, j in ex.perm:
        if i == j:
            outs[j] = pls[j].copy(sends[i])
        else:
            outs[j] = pls[j].empty(part.aval)
            if outs[j].nbytes:
                pairs.append((i, j, client.communicator((devices[i], devices[j]))))
    # every pair waits for its devices' earlier work before any pair ends, so the pairs overlap
    for i, j, comm in pairs:
        _enter(client, comm, [0, 1], [pls[i], pls[j]])
    for i, j, comm in pairs:
        before = len(comm.records)
        comm.rank(0).send(device_address(sends[i]), part.count, part.dtype, peer=1)
        comm.rank(1).recv(device_address(outs[j]), part.count, part.dtype, peer=0)
        _noted(client, ex, comm, before)
    for i, j, comm in pairs:
        _leave(client, comm, [0, 1], [pls[i], pls[j]])
    for j, out in enumerate(outs):
        if out is None:                          # nobody sends to it: zeros, as in jax
            outs[j] = pls[j].buffer_from_pyval(np.zeros(part.aval.shape, part.aval.dtype), aval=part.aval)
    client.counts["collectives_run"] += 1
    return outs
