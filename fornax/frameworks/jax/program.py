"""A jaxpr as a fornax program: compiled device segments, control flow driven from the
host, named host fallbacks.

:func:`build_program` first *flattens* a ClosedJaxpr: call primitives (``jit``,
``custom_jvp_call``, ``custom_vjp_call``, ``remat``/``checkpoint``, ``closed_call``)
are inlined, so one program is one list of equations over values.  It then walks
that list:

* a run of equations with lowering rules (:mod:`.lowering`) becomes one graph IR
  *segment*, compiled whole by the stack's compiler seam (after the family's
  decompositions) and launched as a resident plan on device buffers; only the
  values used after the segment leave it, so the compiler fuses the rest;
* ``cond``, ``while`` and ``scan`` end the segment and run from the host around
  compiled sub-programs, as XLA's GPU runtime does (its conditional and while
  thunks copy the predicate to the host and launch the chosen thunk sequence):
  the branch index / loop predicate is read back (a device-to-host copy that
  waits for the stream), a scan's iteration ``i`` reads its slice of each
  ``xs`` buffer in place (an offset view) and its ``ys`` rows are copied into the
  stacked outputs device to device;
* ``shard_map`` and, inside its body, the collectives (``psum``, ``all_gather``,
  ``ppermute``, ...) become instructions of their own, made by the builders
  :data:`INSTRUCTIONS` holds (:mod:`.shard_map`, :mod:`.collectives`); a body's
  program runs as a generator that stops at each collective, so the programs
  of all the mesh's devices advance together and meet there;
* an equation without a rule (or whose rule refuses it) runs on the host with
  jax's own CPU implementation of the primitive: a *named fallback*, counted in
  the client's report with the reason, never a crash.  A segment that uses an
  op the family's framework seam does not run on the device goes through the
  seam's own ``run`` (its fallback policy, counted the same way).

Values are immutable, so buffers are shared between the values that alias them
and freed (back to the runtime's stream-ordered caching allocator) after their
last use.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import jax
import numpy as np
from jax.extend.core import JaxprEqn, Literal

from ...layers.errors import FornaxError
from ...layers.framework import Framework, ResidentPlan
from ...layers.graph import Graph, Value
from ...layers.runtime import Runtime, Stream
from . import lowering as L

CONTROL = ("cond", "while", "scan")

#: a program's steps: they yield a collective's request, are answered with its results, and
#: return the program's results (see :meth:`Program.steps` and :mod:`.shard_map`); an
#: instruction that holds programs (control flow, a collective) runs as :data:`Yields`
Steps = Generator[Any, Any, list]
Yields = Generator[Any, Any, None]


# ---- what a program needs of its client ------------------------------------------------------------
class ProgramValue(Protocol):
    """A value a program holds between instructions: a device buffer, or (for a dtype with no
    device form) a host value (:class:`.pjrt.Buffer`, :class:`.pjrt.HostValue`)."""

    aval: Any
    nbytes: int                    # bytes on the device (0 for a host value)

    def to_numpy(self) -> np.ndarray:
        """The value on the host (a device-to-host copy that waits for its writer)."""
        ...


class DeviceBuffer(ProgramValue, Protocol):
    """A value in device memory (:class:`.pjrt.Buffer`): every operand of a compiled segment
    and of a scan's slicing, whose dtypes have a device form."""

    @property
    def address(self) -> int | None:
        """The device address of the first byte (None for an empty buffer)."""
        ...

    def device_array(self) -> np.ndarray:
        """A device-to-host copy of the bytes as the device holds them."""
        ...

    def view(self, offset: int, aval: Any) -> DeviceBuffer:
        """A buffer of ``aval`` at byte ``offset`` inside this one, sharing its bytes."""
        ...


def device_address(b: DeviceBuffer) -> int:
    """The device address of a buffer with bytes (every buffer a segment or a device copy
    touches: zero-size arrays run on the host)."""
    address = b.address
    assert address is not None, "a buffer with bytes has a device address"
    return address


class ProgramClient(Protocol):
    """The client a program is built for and runs on (:class:`.pjrt.Client` is one): its seams,
    its stream, its device generation (bumped by a device reset), buffers and accounting."""

    @property
    def runtime(self) -> Runtime: ...

    @property
    def framework(self) -> Framework: ...

    @property
    def stream(self) -> Stream: ...

    @property
    def generation(self) -> int: ...

    @property
    def counts(self) -> Counter[str]: ...

    def empty(self, aval: Any) -> DeviceBuffer:
        """A device buffer for a result of ``aval``, written by the work enqueued next."""
        ...

    def value_from_pyval(self, value: Any, aval: Any) -> ProgramValue:
        """A host value put where the program keeps values of ``aval``'s dtype."""
        ...

    def record_route(self, primitive: str, route: str, reason: str = "", n: int = 1) -> None:
        """Count ``n`` equations of ``primitive`` taking ``route`` (native, fallback, control)."""
        ...


# ---- flattening ------------------------------------------------------------------------------------
@dataclass(eq=False)
class Ref:
    """One value of a flat program."""

    aval: Any                      # a jax aval (ShapedArray; a key array's too)


@dataclass(eq=False)
class Lit:
    """A literal or a closed-over constant (shaped like a jaxpr Literal)."""

    val: Any
    aval: Any


@dataclass(eq=False)
class Flat:
    kind: str                      # prim | cond | while | scan
    eqn: JaxprEqn
    ins: list
    outs: list


def flatten(closed) -> tuple[list[Ref], list, list[Flat]]:
    """(parameters, results, equations) of a ClosedJaxpr with every call inlined."""
    jaxpr, consts = L.open_jaxpr(closed)
    ins = [Ref(v.aval) for v in jaxpr.invars]
    eqns: list[Flat] = []
    outs = _inline(jaxpr, consts, ins, eqns)
    return ins, outs, eqns


def _inline(jaxpr, consts, atoms, eqns: list[Flat]) -> list:
    env: dict = {}

    def read(a):
        return Lit(a.val, a.aval) if isinstance(a, Literal) else env[a]
    for var, c in zip(jaxpr.constvars, consts):
        env[var] = Lit(c, var.aval)
    for var, a in zip(jaxpr.invars, atoms):
        env[var] = a
    for eqn in jaxpr.eqns:
        ins = [read(a) for a in eqn.invars]
        body = L.call_body(eqn)
        if body is not None:
            inner, inner_consts = L.open_jaxpr(body)
            outs = _inline(inner, inner_consts, ins, eqns)
        else:
            outs = [Ref(v.aval) for v in eqn.outvars]
            name = eqn.primitive.name
            eqns.append(Flat(name if name in CONTROL else "prim", eqn, ins, outs))
        for var, o in zip(eqn.outvars, outs):
            env[var] = o
    return [read(a) for a in jaxpr.outvars]


# ---- instructions ----------------------------------------------------------------------------------
@dataclass(eq=False)
class Segment:
    """A compiled graph over device buffers."""

    name: str
    plan: ResidentPlan | None      # None: run through the framework seam's run
    graph: Graph
    ins: list                      # Ref | Lit per plan input
    outs: list[Ref]                # per plan output
    prims: dict                    # primitive -> equations lowered into this segment
    recorded: bool = False
    generation: int = 0            # the client's device generation the plan was loaded in

    def run(self, prog: "Program", env: dict) -> None:
        client = prog.client
        if self.plan is not None and self.generation != client.generation:
            # the device was reset: its module and constants went with the old context
            self.plan = client.framework.prepare(self.graph, client.stream)
            self.generation = client.generation
        args = [prog.device_buffer(env, a) for a in self.ins]
        results = [client.empty(r.aval) for r in self.outs]
        if self.plan is not None:
            self.plan([device_address(b) for b in args], [device_address(b) for b in results],
                      client.stream)
        else:
            feeds = {v.name: b.device_array() for v, b in zip(self.graph.inputs, args)}
            res = client.framework.run(self.graph, feeds)
            if not self.recorded:             # the seam's fallbacks, counted once per segment
                self.recorded = True
                for fb in res.fallbacks:
                    client.record_route(f"graph:{fb['op']}", "fallback", fb["reason"])
            for b, arr in zip(results, res.outputs):
                if b.nbytes:
                    client.runtime.memcpy_h2d(device_address(b), np.ascontiguousarray(arr), client.stream)
        client.counts["segments_run"] += 1
        for r, b in zip(self.outs, results):
            env[r] = b


@dataclass(eq=False)
class Host:
    """One equation run on the host by jax's own CPU implementation."""

    eqn: JaxprEqn
    ins: list
    outs: list[Ref]
    reason: str

    def run(self, prog: "Program", env: dict) -> None:
        client = prog.client
        args = [prog.host_value(env, a) for a in self.ins]
        cpu = jax.devices("cpu")[0]
        # as jax's own eval_jaxpr binds an equation: a higher-order primitive (jit, shard_map,
        # custom_jvp_call) rebuilds its bind parameters from the equation's
        params = self.eqn.primitive.get_bind_params(self.eqn.params)
        with jax.default_device(cpu), self.eqn.ctx.manager:
            res = self.eqn.primitive.bind(*args, **params)
        res = res if self.eqn.primitive.multiple_results else [res]
        for r, v in zip(self.outs, res):
            env[r] = client.value_from_pyval(v, r.aval)
        client.counts["host_fallback_runs"] += 1


@dataclass(eq=False)
class Cond:
    index: Ref | Lit               # int32 or bool
    branches: list["Program"]
    ins: list
    outs: list[Ref]
    yields = True                  # run is a generator (a branch may hold a collective)

    def run(self, prog: "Program", env: dict) -> Yields:
        i = int(np.asarray(prog.host_value(env, self.index)))
        i = min(max(i, 0), len(self.branches) - 1)          # lax.switch clamps the index
        prog.client.counts["host_branches"] += 1
        res = yield from self.branches[i].steps([prog.buffer(env, a) for a in self.ins])
        for r, b in zip(self.outs, res):
            env[r] = b


@dataclass(eq=False)
class While:
    cond: "Program"
    body: "Program"
    cconsts: list
    bconsts: list
    carry: list
    outs: list[Ref]
    yields = True

    def run(self, prog: "Program", env: dict) -> Yields:
        cc = [prog.buffer(env, a) for a in self.cconsts]
        bc = [prog.buffer(env, a) for a in self.bconsts]
        carry = [prog.buffer(env, a) for a in self.carry]
        while True:
            (pred,) = yield from self.cond.steps(cc + carry)
            if not bool(pred.to_numpy()):
                break
            carry = yield from self.body.steps(bc + carry)
            prog.client.counts["host_loop_iterations"] += 1
        for r, b in zip(self.outs, carry):
            env[r] = b


@dataclass(eq=False)
class Scan:
    body: "Program"
    consts: list
    carry: list
    xs: list
    outs: list[Ref]                # carry results, then the stacked ys
    length: int
    reverse: bool
    yields = True

    def run(self, prog: "Program", env: dict) -> Yields:
        client = prog.client
        consts = [prog.buffer(env, a) for a in self.consts]
        carry = [prog.buffer(env, a) for a in self.carry]
        xs = [prog.device_buffer(env, a) for a in self.xs]
        n_carry = len(carry)
        ys = [client.empty(r.aval) for r in self.outs[n_carry:]]
        x_avals = [r.aval for r in self.body.ins[len(consts) + n_carry:]]
        x_bytes = [L.device_nbytes(a) for a in x_avals]
        order = range(self.length - 1, -1, -1) if self.reverse else range(self.length)
        for i in order:
            x_i: list[ProgramValue] = [x.view(i * nb, a) for x, nb, a in zip(xs, x_bytes, x_avals)]
            res = yield from self.body.steps(consts + carry + x_i)
            carry = res[:n_carry]
            for y, y_i in zip(ys, res[n_carry:]):
                if y_i.nbytes:
                    y_i = cast(DeviceBuffer, y_i)    # a ys row with bytes has a device dtype
                    client.runtime.memcpy_d2d(device_address(y) + i * y_i.nbytes, device_address(y_i),
                                              y_i.nbytes, client.stream)
            client.counts["host_loop_iterations"] += 1
        for r, b in zip(self.outs, [*carry, *ys]):
            env[r] = b


# ---- the program -----------------------------------------------------------------------------------
@dataclass(eq=False)
class Program:
    client: ProgramClient
    name: str
    ins: list[Ref]
    outs: list                     # Ref | Lit
    instrs: list = field(default_factory=list)
    last_use: dict = field(default_factory=dict)    # instruction index -> refs to drop after it
    consts: dict = field(default_factory=dict)      # Lit -> its device buffer (uploaded once)

    def buffer(self, env: dict, a) -> ProgramValue:
        if isinstance(a, Lit):
            b = self.consts.get(a)
            if b is None or getattr(b, "_generation", self.client.generation) != self.client.generation:
                b = self.consts[a] = self.client.value_from_pyval(a.val, a.aval)   # (again, after a reset)
            return b
        return env[a]

    def device_buffer(self, env: dict, a) -> DeviceBuffer:
        """:meth:`buffer` for an operand whose dtype has a device form (a segment's, a scan's
        ``xs``): a device buffer."""
        return cast(DeviceBuffer, self.buffer(env, a))

    def host_value(self, env: dict, a):
        if isinstance(a, Lit):
            return a.val
        b = env[a]
        value = b.to_numpy()
        return value if L.is_key(b.aval.dtype) else jax.numpy.asarray(value)

    def run(self, args: list[ProgramValue]) -> list[ProgramValue]:
        """Run the program to its end; its results."""
        steps = self.steps(args)
        try:
            request = next(steps)
        except StopIteration as done:
            return done.value
        steps.close()
        raise FornaxError(f"{self.name}: {request} needs the other devices of a shard_map",
                          seam="framework", hint="put the collective inside jax.shard_map")

    def steps(self, args: list[ProgramValue]) -> Steps:
        """The program as a generator: it yields at each collective a request the devices of
        its mesh answer together (:mod:`.shard_map`) and returns the results."""
        env: dict = dict(zip(self.ins, args))
        for i, ins in enumerate(self.instrs):
            if getattr(ins, "yields", False):
                yield from ins.run(self, env)
            else:
                ins.run(self, env)
            for r in self.last_use.get(i, ()):
                env.pop(r, None)
        return [self.client.value_from_pyval(a.val, a.aval) if isinstance(a, Lit)
                else env[a] for a in self.outs]

    def describe(self, indent: str = "") -> str:
        lines = [f"{indent}program {self.name}: {len(self.ins)} parameter(s), {len(self.outs)} result(s)"]
        for ins in self.instrs:
            if isinstance(ins, Segment):
                prims = ", ".join(f"{p}×{n}" if n > 1 else p for p, n in sorted(ins.prims.items()))
                how = "compiled" if ins.plan is not None else "through the framework seam's run"
                lines.append(f"{indent}  segment {ins.name} ({how}): {prims}")
            elif isinstance(ins, Host):
                lines.append(f"{indent}  host {ins.eqn.primitive.name}: {ins.reason}")
            elif isinstance(ins, Cond):
                lines.append(f"{indent}  cond over {len(ins.branches)} branches")
                for b in ins.branches:
                    lines.append(b.describe(indent + "    "))
            elif isinstance(ins, While):
                lines.append(f"{indent}  while")
                lines.append(ins.cond.describe(indent + "    "))
                lines.append(ins.body.describe(indent + "    "))
            elif isinstance(ins, Scan):
                lines.append(f"{indent}  scan length {ins.length}{' reversed' if ins.reverse else ''}")
                lines.append(ins.body.describe(indent + "    "))
            elif hasattr(ins, "describe"):
                lines.append(ins.describe(indent + "  "))
        return "\n".join(lines)


#: a builder of the instruction for an equation of a primitive that is neither a lowering
#: rule's nor control flow (``shard_map``, the collectives): it returns the instruction (with
#: ``ins`` and ``route``; ``yields`` when its ``run`` is a generator), or the reason the
#: equation runs on the host instead
InstructionBuilder = Callable[["Builder", Flat], Any]
INSTRUCTIONS: dict[str, InstructionBuilder] = {}


def build_program(client: ProgramClient, closed, name: str = "fn",
                  axes: dict[str, tuple[int, int]] | None = None) -> Program:
    """Compile a ClosedJaxpr (or an open jaxpr without constants) into a :class:`Program` for
    ``client``; ``axes``: inside a ``shard_map`` body, each mesh axis's (index of this device,
    size)."""
    ins, outs, eqns = flatten(closed)
    return Builder(client, name, axes).build(ins, outs, eqns)


class Builder:
    """Builds one :class:`Program` (and its control flow's sub-programs) for a client."""

    def __init__(self, client: ProgramClient, name: str, axes: dict[str, tuple[int, int]] | None = None):
        self.client, self.name = client, name
        #: inside a shard_map body: mesh axis -> (this device's index, size); None outside
        self.axes = axes
        self.nseg = 0

    def build(self, ins: list[Ref], outs: list, eqns: list[Flat]) -> Program:
        prog = Program(self.client, self.name, ins, outs)
        end = len(eqns)
        last: dict = {}
        for i, e in enumerate(eqns):
            for a in e.ins:
                if isinstance(a, Ref):
                    last[a] = i
        for a in outs:
            if isinstance(a, Ref):
                last[a] = end
        self._last = last
        seg = None
        for i, e in enumerate(eqns):
            hook = INSTRUCTIONS.get(e.eqn.primitive.name) if e.kind == "prim" else None
            if hook is not None:
                if seg is not None:
                    self._close(seg, i, prog)
                    seg = None
                made = hook(self, e)
                if isinstance(made, str):
                    prog.instrs.append(Host(e.eqn, e.ins, e.outs, made))
                    self.client.record_route(e.eqn.primitive.name, "fallback", made)
                else:
                    prog.instrs.append(made)
                    self.client.record_route(e.eqn.primitive.name, made.route)
                continue
            if e.kind == "prim":
                if seg is None:
                    seg = _Open(self)
                reason = seg.add(e)
                if reason is None:
                    continue
                self._close(seg, i, prog)
                seg = None
                prog.instrs.append(Host(e.eqn, e.ins, e.outs, reason))
                self.client.record_route(e.eqn.primitive.name, "fallback", reason)
            else:
                if seg is not None:
                    self._close(seg, i, prog)
                    seg = None
                odd = _host_only(e)
                if odd is not None:         # a loop or branch carrying complex values: jax runs it
                    reason = f"{e.kind}: {odd} has no fornax device dtype"
                    prog.instrs.append(Host(e.eqn, e.ins, e.outs, reason))
                    self.client.record_route(e.kind, "fallback", reason)
                    continue
                prog.instrs.append(self._control(e))
                self.client.record_route(e.kind, "control")
        if seg is not None:
            self._close(seg, end, prog)
        # drop each value after the instruction that uses it last
        owner = {}
        for k, ins_ in enumerate(prog.instrs):
            for r in _refs_of(ins_):
                owner[r] = k
        for r, k in owner.items():
            if last.get(r, -1) < end:
                prog.last_use.setdefault(k, []).append(r)
        return prog

    def _close(self, seg: "_Open", upto: int, prog: Program) -> None:
        """Finish a segment before flat equation ``upto``: its results are the values used at
        or after ``upto`` (or returned)."""
        if not seg.values:
            return
        needed = [r for r, v in seg.values.items() if self._last.get(r, -1) >= upto]
        aliases = []
        outs = []
        for r in needed:
            v = seg.values[r]
            src = seg.input_of.get(id(v))
            if src is not None:
                aliases.append((r, src))           # a parameter passed through unchanged
            else:
                outs.append(r)
        g = seg.graph
        if outs:
            g.output(*(seg.values[r] for r in outs))
        for p, n in seg.prims.items():
            self.client.record_route(p, "native", n=n)
        if outs:
            route = self.client.framework.device_route(g)
            plan = None if route is not None else self.client.framework.prepare(g, self.client.stream)
            prog.instrs.append(Segment(g.name, plan, g, seg.ins, outs, dict(seg.prims),
                                       generation=self.client.generation))
        for r, src in aliases:
            prog.instrs.append(_Alias(r, src))

    def sub(self, closed, what: str) -> Program:
        """A sub-program (a branch, a loop body) for the same client and axes."""
        ins, outs, eqns = flatten(closed)
        return Builder(self.client, f"{self.name}_{what}", self.axes).build(ins, outs, eqns)

    def _control(self, e: Flat):
        p = e.eqn.params
        if e.kind == "cond":
            branches = [self.sub(b, f"branch{k}") for k, b in enumerate(p["branches"])]
            return Cond(e.ins[0], branches, e.ins[1:], e.outs)
        if e.kind == "while":
            nc, nb = p["cond_nconsts"], p["body_nconsts"]
            return While(self.sub(p["cond_jaxpr"], "cond"), self.sub(p["body_jaxpr"], "body"),
                         e.ins[:nc], e.ins[nc:nc + nb], e.ins[nc + nb:], e.outs)
        nc, ncarry = p["num_consts"], p["num_carry"]
        return Scan(self.sub(p["jaxpr"], "scan"), e.ins[:nc], e.ins[nc:nc + ncarry],
                    e.ins[nc + ncarry:], e.outs, int(p["length"]), bool(p["reverse"]))


def _host_only(e) -> object | None:
    """The first dtype among ``e``'s operands and results that has no device form, or None."""
    for a in (*e.ins, *e.outs):
        dt = getattr(a.aval, "dtype", None)
        if dt is not None and L.device_dtype(dt) is None and not L.is_key(dt):
            return dt
    return None


@dataclass(eq=False)
class _Alias:
    dst: Ref
    src: object

    def run(self, prog: Program, env: dict) -> None:
        env[self.dst] = prog.buffer(env, self.src)


def _refs_of(ins) -> list:
    """The values an instruction reads (for freeing after the last one)."""
    if isinstance(ins, Segment):
        return [a for a in ins.ins if isinstance(a, Ref)]
    if isinstance(ins, _Alias):
        return [ins.src] if isinstance(ins.src, Ref) else []
    if isinstance(ins, Cond):
        return [a for a in (ins.index, *ins.ins) if isinstance(a, Ref)]
    if isinstance(ins, While):
        return [a for a in (*ins.cconsts, *ins.bconsts, *ins.carry) if isinstance(a, Ref)]
    if isinstance(ins, Scan):
        return [a for a in (*ins.consts, *ins.carry, *ins.xs) if isinstance(a, Ref)]
    return [a for a in ins.ins if isinstance(a, Ref)]


class _Open:
    """A segment being built: its graph, its parameters and the values it defines."""

    def __init__(self, builder: Builder):
        builder.nseg += 1
        self.graph = Graph(f"{builder.name}_seg{builder.nseg}" if builder.nseg > 1 else builder.name)
        self.ctx = L.LowerCtx(self.graph, builder.axes)
        self.ins: list = []                 # Ref | Lit per graph input
        self.input_of: dict = {}            # id(graph input Value) -> Ref | Lit
        self.params: dict = {}              # Ref | Lit -> graph input Value
        self.values: dict = {}              # Ref defined here -> Value
        self.lits: dict = {}                # Lit -> constant Value
        self.prims: dict = {}

    def value(self, a) -> Value:
        if a in self.values:
            return self.values[a]
        if isinstance(a, Lit) and a.aval.size <= 1 << 16:      # bigger: a parameter, uploaded once
            v = self.lits.get(a)
            if v is None:
                v = self.lits[a] = L.literal(self.ctx, a)
            return v
        v = self.params.get(a)
        if v is None:
            v = self.graph.input(f"p{len(self.ins)}", L.device_shape(a.aval), L.device_dtype(a.aval.dtype))
            self.params[a] = v
            self.input_of[id(v)] = a
            self.ins.append(a)
        return v

    def add(self, e: Flat) -> str | None:
        """Lower ``e`` into the segment; None, or why it cannot be."""
        try:
            for a in (*e.ins, *e.outs):
                dt = getattr(a.aval, "dtype", None)
                if dt is None or L.device_dtype(dt) is None:
                    raise L.NotLowerable(f"{e.eqn.primitive.name}: {dt} has no fornax device dtype")
                if 0 in L.device_shape(a.aval):
                    raise L.NotLowerable(f"{e.eqn.primitive.name}: zero-size arrays run on the host")
            vals = L.lower_eqn(self.ctx, e.eqn, [self.value(a) for a in e.ins])
        except L.NotLowerable as exc:
            return str(exc)
        except (FornaxError, AssertionError, ValueError, TypeError) as exc:
            return f"{e.eqn.primitive.name}: the lowering failed ({type(exc).__name__}: {exc})"
        for r, v in zip(e.outs, vals):
            self.values[r] = v
        name = e.eqn.primitive.name
        self.prims[name] = self.prims.get(name, 0) + 1
        return None
