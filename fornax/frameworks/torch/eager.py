"""ATen kernels of the ``fornax`` device: every op that reaches the PrivateUse1 key.

A handful of kernels are registered one by one (allocation, copies between host and
device, scalar reads, ``resize_``, and the metadata-only view ops, which run the CPU
kernel on the same storage because they never touch bytes).  Every other op reaches
one boxed fallback, :func:`dispatch`, which routes it through the active stack's
framework seam, in this order:

1. **view** — an op whose result aliases an input (schema ``Tensor(a)``) is answered by
   running it on meta tensors and viewing the same storage with the result's sizes,
   strides and offset: no bytes move, aliasing and in-place mutation through the view
   behave as in PyTorch;
2. the family's own table (``framework.torch_route``) may send an op to PyTorch's
   decomposition or to the CPU on purpose;
3. **in-place and out=** ops run their functional twin and copy the result into the
   mutated tensor (strides, offsets and dtype casts honoured);
4. **native** — the op is lowered (:mod:`.lowering`) into a one-op fornax graph,
   compiled by the stack's compiler seam (library routines where the compiler routes
   them), cached by signature, and launched on the device-resident buffers through the
   runtime seam;
5. **decomposed** — PyTorch's own decomposition (``torch._decomp``) runs, its pieces
   come back here;
6. **fallback** — the op runs on the CPU: inputs are copied to the host, results (and
   mutated inputs) back; counted with its reason.  Seeded random ops take this route so
   ``torch.manual_seed`` reproduces CPU results exactly, except dropout, whose mask is drawn
   from the host generator as CPU draws it while the product runs natively (:mod:`.host_mask`).

Every call is counted per op and route in the session (:meth:`Session.report`).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ...layers.errors import FornaxError
from ...layers.graph import Graph
from . import checks as _checks
from . import dispatch_cache as _cache
from . import mathbits as _mathbits
from . import placement as _placement
from . import profiler as _profiler
from . import requested as _requested
from . import tensors as T
from .lowering import TORCH_TO_DTYPE, LowerCtx, NotLowerable, OutMeta, lookup, lower
from . import hazards as _hazards
from . import host_mask as _host_mask
from . import concatenation as _concatenation
from . import lifted as _lifted
from . import list_ops as _list_ops
from .host_fallback import run_on_host as _on_host
from . import strided as _strided
from .session import Session, current
from .streams import current_runtime_stream

aten = torch.ops.aten
CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
PLAN_CACHE_SIZE = 1024
_local = threading.local()


# ---------------------------------------------------------------------------------------------
# op classification
@dataclass(frozen=True)
class OpInfo:
    name: str
    kind: str                       # view | inplace | out | functional
    functional: object = None       # the functional twin of an in-place / out= op
    mutated: tuple = ()             # (position, name) of the arguments the op writes
    seeded: bool = False
    options: bool = False           # the functional twin takes dtype/layout/device/pin_memory


_OPTIONS = (("dtype", "Optional[int]"), ("layout", "Optional[int]"), ("device", "Optional[Device]"),
            ("pin_memory", "Optional[bool]"))


_INFO: dict = {}
_UNSET = object()


def op_info(op) -> OpInfo:
    info = _INFO.get(op)
    if info is None:
        info = _INFO[op] = _classify(op)
    return info


def _classify(op) -> OpInfo:
    schema = op._schema
    name = op.name()
    mutated = tuple((i, a.name) for i, a in enumerate(schema.arguments)
                    if a.alias_info is not None and a.alias_info.is_write)
    seeded = torch.Tag.nondeterministic_seeded in op.tags
    if not mutated:
        rets = schema.returns
        if rets and all(r.alias_info is not None for r in rets):
            return OpInfo(name, "view", seeded=seeded)
        return OpInfo(name, "functional", seeded=seeded)
    packet = getattr(aten, schema.name.split("::")[1].rstrip("_"), None) \
        if schema.name.startswith("aten::") else None
    outs = [a for a in schema.arguments if a.is_out]
    if outs:
        keep = [(a.name, str(a.type)) for a in schema.arguments if not a.is_out]
        twin = _find_overload(packet, keep)
        options = False
        if twin is None:              # a factory: the functional form adds TensorOptions
            twin = _find_overload(packet, keep + list(_OPTIONS))
            options = twin is not None
        return OpInfo(name, "out", twin, mutated, seeded, options)
    base = schema.name.split("::")[1]
    if base.endswith("_") and packet is not None:
        twin = getattr(packet, op._overloadname, None)
        if twin is not None and [(a.name, str(a.type)) for a in twin._schema.arguments] != \
                [(a.name, str(a.type)) for a in schema.arguments]:
            twin = None
        return OpInfo(name, "inplace", twin, mutated, seeded)
    return OpInfo(name, "mutating", None, mutated, seeded)


def _find_overload(packet, arg_names: list[tuple[str, str]]):
    if packet is None:
        return None
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        if [(a.name, str(a.type)) for a in cand._schema.arguments] == arg_names and \
                not any(a.alias_info is not None and a.alias_info.is_write for a in cand._schema.arguments):
            return cand
    return None


# ---------------------------------------------------------------------------------------------
# the boxed fallback
def dispatch(op, *args, **kwargs):
    """The PrivateUse1 boxed fallback: route one ATen op (see the module docstring)."""
    session = current()
    with session.lock:
        if _profiler.enabled():
            return _profiler.run(session, op, _dispatch, args, kwargs)
        fast_key = _cache.key(op, args, kwargs)
        if fast_key is not None:
            launch = session.fast.get(fast_key)
            if launch is not None:
                return launch(session, args, kwargs)
        return _dispatch(session, op, args, kwargs, fast_key)


def _dispatch(session: Session, op, args, kwargs, fast_key=None):
    info = op_info(op)
    _checks.validate(info.name, op, args, kwargs)
    device = _requested.device_argument(op, args, kwargs)
    _requested.check_index(device)
    given = (args, kwargs)
    args, kwargs = _adopt_cpu_scalars(info, op, args, kwargs)
    if info.kind == "view":
        session.stats.record(info.name, "view")
        return _view(op, args, kwargs)
    _hazards.before_use(session, args, kwargs)      # work still pending on these tensors
    if info.kind == "functional":
        args, kwargs = _resolve_flags(session, args, kwargs)
        if _requested.elsewhere(device):
            return _on_host(session, info, op, args, kwargs,
                        "its device= argument asks for another device", home=False)
    rule = session.rules.get(op, _UNSET)
    if rule is _UNSET:
        rule = session.rules[op] = session.framework.torch_route(info.name)
    if rule is not None:
        if rule.kind == "fallback":
            return _on_host(session, info, op, args, kwargs, rule.reason)
        out = _decompose(session, info, op, args, kwargs, rule.reason)
        if out is not NotImplemented:
            return out
    if info.name == "aten::native_dropout":
        out = _host_mask.dropout(session, args, kwargs, _cached_plan, current_runtime_stream(session))
        if out is not None:
            session.stats.record(info.name, "native", _host_mask.REASON)
            return out
    if info.seeded:
        return _on_host(session, info, op, args, kwargs,
                    "random numbers come from the host generator, so torch.manual_seed "
                    "reproduces CPU results")
    if info.kind in ("inplace", "out"):
        if info.functional is not None:
            pristine = fast_key if args is given[0] and kwargs is given[1] else None
            return _via_functional(session, info, op, args, kwargs, pristine)
        return _on_host(session, info, op, args, kwargs, f"no functional form of {info.name}")
    if info.kind == "mutating":
        return _on_host(session, info, op, args, kwargs, f"{info.name} mutates its inputs in place")
    if info.name == "aten::as_strided_copy":
        return _as_strided_copy(session, info, *args, **kwargs)
    if op is aten.cat.default:
        out = _concatenation.nonempty(session, info, op, args, kwargs, _meta)
        if out is not None:
            return out
    out, reason = _native(session, info, op, args, kwargs)
    if out is not NotImplemented:
        session.stats.record(info.name, "native")
        if fast_key is not None and args is given[0] and kwargs is given[1] and \
                not _checks.per_call(info.name):
            # it ran natively on the arguments as given: later calls like it launch directly
            entry = session.plans.get(_signature(op, args, kwargs))
            if isinstance(entry, _Native):
                _cache.install(session, fast_key, _cache.Launch(
                    info.name, entry.plan, entry.outs, entry.structure, entry.present, materialize))
        return out
    out = _decompose(session, info, op, args, kwargs, reason)
    if out is not NotImplemented:
        return out
    return _on_host(session, info, op, args, kwargs, reason)


def _as_strided_copy(session: Session, info, self, size, stride, storage_offset=None):
    """``as_strided_copy`` reads the input's *storage* (a non-contiguous input's elements are
    not its storage order), so it runs as PyTorch defines it: the ``as_strided`` view of
    the same storage, cloned."""
    session.stats.record(info.name, "decomposed", "it reads the input's storage: an as_strided view, cloned")
    return aten.clone.default(aten.as_strided.default(self, size, stride, storage_offset))


def _adopt_cpu_scalars(info, op, args, kwargs):
    """CPU tensors PyTorch lets mix with device tensors (0-d "CPU scalars", advanced-indexing
    indices) move to the device; other CPU tensors are refused (see :mod:`.placement`)."""
    args, kwargs = _placement.wrap_numbers(op, args, kwargs)
    return _placement.adopt(info.name, op, args, kwargs, _tensors(args, kwargs))


def _tensors(args, kwargs) -> list:
    """The tensors among an op's arguments, in order (one level of lists, as ATen schemas
    allow: ``Tensor[]`` and ``Tensor?[]``)."""
    out = []
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out.extend(v for v in x if isinstance(v, torch.Tensor))
    return out


# ---------------------------------------------------------------------------------------------
# views
def _meta_like(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with ``t``'s sizes, strides, offset and storage size."""
    n = t.untyped_storage().nbytes() // t.element_size()
    base = torch.empty(n, dtype=t.dtype, device="meta")
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def _to_meta(x):
    if T.is_fornax(x):
        return _meta_like(x)
    if isinstance(x, torch.device) and x.type == T.DEVICE:
        return torch.device("meta")
    return x


def _view(op, args, kwargs):
    margs, mkwargs = tree_map(_to_meta, (args, kwargs))
    res = op(*margs, **mkwargs)
    sources = [a for a in tree_flatten((args, kwargs))[0] if T.is_fornax(a)]
    msources = [a for a in tree_flatten((margs, mkwargs))[0] if isinstance(a, torch.Tensor)
                and a.device.type == "meta"]

    def back(m):
        if not isinstance(m, torch.Tensor):
            return m
        # the input whose storage the result views (same meta storage)
        src = next((s for s, ms in zip(sources, msources)
                    if ms.untyped_storage()._cdata == m.untyped_storage()._cdata), sources[0])
        view = T.wrap(src.untyped_storage(), m.shape, m.stride(), m.dtype, m.storage_offset())
        return _mathbits.carry(view, m)
    return tree_map(back, res)


def _resolve_flags(session: Session, args, kwargs):
    """Inputs carrying PyTorch's lazy conj / neg flag replaced by their logical values
    (device kernels read raw bytes; see :mod:`.mathbits`)."""
    if not any(_mathbits.flagged(t) for t in _tensors(args, kwargs)):
        return args, kwargs

    def resolve(x):
        return _mathbits.resolved(x, copy_into, _unary(session)) if T.is_fornax(x) else x
    return tree_map(resolve, (args, kwargs))


def _unary(session: Session):
    return lambda op, x: _dispatch(session, op, (x,), {})


# ---------------------------------------------------------------------------------------------
# in-place and out= through the functional twin
def _via_functional(session, info: OpInfo, op, args, kwargs, fast_key=None):
    # a ``_foreach_*_`` op writes every tensor of its one mutated list (a fused optimizer
    # step writes several lists, and takes the route below that runs it on the host)
    listed = info.kind == "inplace" and isinstance(args[0], (list, tuple)) and len(info.mutated) == 1
    if info.kind == "out":
        names = [a.name for a in op._schema.arguments]
        outs = [kwargs[a.name] if a.name in kwargs else args[names.index(a.name)]
                for a in op._schema.arguments if a.is_out]
        fkwargs = {k: v for k, v in kwargs.items() if k not in {a.name for a in op._schema.arguments
                                                                 if a.is_out}}
        fargs = args[:len([a for a in op._schema.arguments if not a.is_out and not a.kwarg_only])]
        if info.options:
            fkwargs = dict(fkwargs, dtype=outs[0].dtype, device=outs[0].device)
    else:
        outs = list(args[0]) if listed else [args[0]]
        fargs, fkwargs = args, kwargs
    if listed and _list_ops.crossed(args, kwargs):
        return _on_host(
            session, info, op, args, kwargs, f"{info.name}: a tensor it writes is also read at "
            "another position of its lists, which the list ops do in order")
    _checks.castable(info.name, info.functional, fargs, fkwargs, outs,
                     lambda a: tree_map(_to_meta, a))
    fargs, fkwargs = _resolve_flags(session, fargs, fkwargs)
    finfo = op_info(info.functional)
    res = NotImplemented
    if finfo.kind == "functional" and not finfo.seeded and \
            session.framework.torch_route(finfo.name) is None:
        # straight into the destination when it is a dense tensor of the result's shape
        res, _ = _native(session, finfo, info.functional, fargs, fkwargs,
                         dest=None if any(_mathbits.flagged(o) for o in outs) else outs)
        if res is not NotImplemented and all(a is b for a, b in zip(
                res if isinstance(res, tuple) else (res,), outs)):
            session.stats.record(info.name, "native", f"through {finfo.name}")
            if fast_key is not None and info.kind == "inplace" and len(outs) == 1 and \
                    not _checks.per_call(info.name):
                # an in-place op computed straight into its tensor: later calls like it too
                entry = session.plans.get(_signature(info.functional, fargs, fkwargs))
                if isinstance(entry, _Native) and entry.plan is not None and entry.present == (0,):
                    _cache.install(session, fast_key, _cache.Launch(
                        info.name, entry.plan, entry.outs, entry.structure, entry.present,
                        materialize, into=True))
            if listed:
                return None
            return outs[0] if info.kind == "inplace" or len(outs) == 1 else tuple(outs)
    if res is NotImplemented:
        res = _dispatch(session, info.functional, fargs, fkwargs)
    results = list(res) if isinstance(res, (tuple, list)) else [res]
    if len(results) != len(outs):
        return _on_host(session, info, op, args, kwargs, f"{info.name} writes {len(outs)} tensors but "
                    f"its functional form returns {len(results)}")
    for dst, src in zip(outs, results):
        if not T.is_fornax(dst):
            raise RuntimeError(f"{info.name}: the output tensor is on {dst.device}, expected fornax:0")
        if info.kind == "out" and tuple(dst.shape) != tuple(src.shape):
            aten.resize_.default(dst, src.shape)
        copy_into(dst, src)
    session.stats.relabel_last(info.name, f"through {finfo.name}")
    if info.kind == "out":
        return outs[0] if len(outs) == 1 else tuple(outs)
    return None if listed else args[0]


# ---------------------------------------------------------------------------------------------
# native: a cached one-op graph on the device
@dataclass
class _Native:
    plan: object                    # ResidentPlan (None: every result is empty or None)
    outs: list                      # OutMeta (or None: torch returns no tensor) per output
    structure: object               # how outputs pack: None (one tensor) or a count (tuple)
    present: tuple = ()             # the outputs the plan computes, in its output order


@dataclass
class _Unlowerable:
    reason: str


def _key_of(x):
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), x.dtype)
    if isinstance(x, bool):
        return ("b", x)
    if isinstance(x, int):
        return ("i", x)
    if isinstance(x, float):
        return ("f", repr(x))
    if isinstance(x, (list, tuple)):
        return ("L", tuple(_key_of(v) for v in x))
    if x is None or isinstance(x, (str, torch.dtype, torch.layout, torch.memory_format, torch.device)):
        return ("o", str(x))
    if isinstance(x, complex):
        return ("c", repr(x))
    raise TypeError(type(x).__name__)


def _signature(op, args, kwargs):
    try:
        return (op, _key_of(list(args)), _key_of(sorted(kwargs.items())))
    except TypeError:
        return None


def _native(session: Session, info: OpInfo, op, args, kwargs, dest=None):
    """Run ``op`` as a cached one-op device graph; returns (result, "") or (NotImplemented,
    reason).  ``dest``: tensors to write the results into when each is a contiguous fornax
    tensor of the result's shape and dtype (else fresh tensors are allocated).

    A call whose float arguments keep changing (see :mod:`.lifted`) runs a plan that reads
    them as 0-d inputs, compiled once for all their values."""
    if lookup(op) is None:
        return NotImplemented, f"no fornax lowering for {info.name}"
    key = _signature(op, args, kwargs)
    if key is None:
        return NotImplemented, f"{info.name}: an argument type the lowering does not take"
    entry = session.plans.get(key)
    scalars: list = []
    if entry is None and _lifted.varying(session, key, args, kwargs):
        entry, scalars = _lifted_entry(session, info, op, args, kwargs, key)
    if entry is None:
        entry = _build(session, info, op, args, kwargs)
        session.plans[key] = entry
        _evict(session)
    if isinstance(entry, _Unlowerable):
        return NotImplemented, entry.reason
    tensors = _tensors(args, kwargs)
    if dest is not None and len(dest) == len(entry.outs) and all(
            m is not None and T.is_fornax(d) and d.is_contiguous() and tuple(d.shape) == m.shape
            and d.dtype == m.dtype for d, m in zip(dest, entry.outs)):
        outs = list(dest)
    else:
        outs = [None if m is None else T.empty(m.shape, m.dtype, session=session)
                for m in entry.outs]
    if entry.plan is not None:
        stream = current_runtime_stream(session)
        temps: list[torch.Tensor] = []
        ptrs = [materialize(session, t, temps, stream) for t in tensors]
        ptrs += [_lifted.upload(session, value, dt, temps, stream) for value, dt in scalars]
        entry.plan(ptrs, [T.address(outs[k], session) for k in entry.present], stream)
        del temps
    return _pack(entry.structure, outs), ""


def _lifted_entry(session: Session, info: OpInfo, op, args, kwargs, key):
    """The plan of a call whose float arguments become 0-d inputs, and the (value, dtype) of
    each such input in the plan's order; (None, []) when the call cannot run that way (the
    route of :func:`_build` then compiles it for these values)."""
    # a pointwise op's results (a list op's too) follow its tensors' shapes and the floats'
    # type, never their values: its metas are kept per signature (other ops run on meta
    # tensors every call)
    meta_key = ("lifted-meta", _lifted.abstract(key)) \
        if torch.Tag.pointwise in op.tags or info.name.startswith("aten::_foreach_") else None
    meta = session.plans.get(meta_key) if meta_key is not None else None
    if meta is None:
        meta = _meta(info, op, args, kwargs)
        if meta_key is not None and isinstance(meta, tuple):
            session.plans[meta_key] = meta
    if not isinstance(meta, tuple):
        return None, []
    outs, structure = meta
    tensors = _tensors(args, kwargs)
    if any(m is None or 0 in m.shape for m in outs) or any(t.numel() == 0 for t in tensors):
        return None, []
    largs, lkwargs, flat = _lifted.marked(args, kwargs)
    try:
        g, ctx, present = _lower(info, op, largs, lkwargs, outs)
    except NotLowerable:
        return None, []
    if not ctx.lifted:
        return None, []                  # no float reached the graph as a scalar operand
    gkey = _lifted.plan_key(key, g)
    entry = session.plans.get(gkey)
    if entry is None:
        if not _lifted.room(session, key):
            return None, []
        entry = _prepare(session, info, g, len(tensors) + len(ctx.lifted), outs, structure, present)
        session.plans[gkey] = entry
        _evict(session)
    if isinstance(entry, _Unlowerable):
        return None, []
    return entry, [(flat[slot], dt) for slot, dt in ctx.lifted]


def _pack(structure, outs):
    if structure is None:
        return outs[0]
    return tuple(outs)


def _meta(info: OpInfo, op, args, kwargs):
    """(output metas, how they pack: None for one tensor, else their count) from running
    ``op`` on meta tensors, or why the device cannot run it (:class:`_Unlowerable`)."""
    tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
    for t in tensors:
        if t.dtype not in TORCH_TO_DTYPE:
            return _Unlowerable(f"{info.name}: {t.dtype} has no fornax graph dtype")
    try:
        margs, mkwargs = tree_map(_to_meta, (args, kwargs))
        mres = op(*margs, **mkwargs)
    except (NotImplementedError, RuntimeError) as exc:
        return _Unlowerable(f"{info.name}: no meta kernel to infer its result ({type(exc).__name__})")
    mflat = [mres] if isinstance(mres, torch.Tensor) else list(mres) \
        if isinstance(mres, (tuple, list)) else None
    if mflat is None or not all(m is None or isinstance(m, torch.Tensor) for m in mflat):
        return _Unlowerable(f"{info.name}: returns a non-tensor result")
    outs = [None if m is None else OutMeta(tuple(m.shape), m.dtype) for m in mflat]
    for m in outs:
        if m is not None and m.dtype not in TORCH_TO_DTYPE:
            return _Unlowerable(f"{info.name}: result dtype {m.dtype} has no fornax graph dtype")
    return outs, None if isinstance(mres, torch.Tensor) else len(outs)


def _lower(info: OpInfo, op, args, kwargs, outs):
    """The one-op graph of the call (tensors as inputs ``in0``, ``in1``, ...), its lowering
    context and which outputs it computes; raises :class:`NotLowerable`."""
    g = Graph(_graph_name(info.name))
    flat, spec = tree_flatten((args, kwargs))
    n = 0
    for i, x in enumerate(flat):
        if isinstance(x, torch.Tensor):
            flat[i] = g.input(f"in{n}", tuple(x.shape), TORCH_TO_DTYPE[x.dtype])
            n += 1
    vargs, vkwargs = tree_unflatten(flat, spec)
    ctx = LowerCtx(g, outs)
    vals = lower(ctx, op, tuple(vargs), dict(vkwargs))
    present = tuple(k for k, v in enumerate(vals) if v is not None)
    g.output(*(v for v in vals if v is not None))
    return g, ctx, present


def _prepare(session: Session, info: OpInfo, g: Graph, inputs: int, outs, structure, present):
    """Compile ``g`` into a resident plan that reads all its ``inputs``."""
    try:
        route = session.framework.device_route(g)
        if route is not None:
            return _Unlowerable(route.reason)
        plan = session.framework.prepare(g, current_runtime_stream(session))
    except FornaxError as exc:
        if getattr(exc, "build_log", ""):
            # its kernel did not build (a module load's build error): the op runs on the host;
            # nothing launched, so the context stays usable
            return _Unlowerable(f"{info.name}: compile error: {exc.message} [{exc.code}]")
        return _Unlowerable(f"{info.name}: the {exc.seam or 'compiler'} seam refused it: {exc.message}")
    if len(plan.plan.inputs) != inputs:
        plan.release()
        return _Unlowerable(f"{info.name}: its graph does not read every input")
    return _Native(plan, outs, structure, present)


def _build(session: Session, info: OpInfo, op, args, kwargs):
    meta = _meta(info, op, args, kwargs)
    if not isinstance(meta, tuple):
        return meta
    outs, structure = meta
    tensors = _tensors(args, kwargs)
    if all(m is None or 0 in m.shape for m in outs):
        return _Native(None, outs, structure, ())        # nothing to compute: shapes only
    if any(t.numel() == 0 for t in tensors):
        return _Unlowerable(f"{info.name}: zero-size inputs with a non-empty result run on the host")
    try:
        g, _, present = _lower(info, op, args, kwargs, outs)
    except NotLowerable as exc:
        return _Unlowerable(str(exc))
    return _prepare(session, info, g, len(tensors), outs, structure, present)


def _graph_name(name: str) -> str:
    return "aten_" + re.sub(r"[^0-9A-Za-z_]", "_", name.removeprefix("aten::"))


# ---------------------------------------------------------------------------------------------
# the plan cache; strided device buffers (gathered into a contiguous buffer, scattered into a view)
def _cached_plan(session: Session, key, build):
    plan = session.plans.get(key)
    if plan is None:
        plan = session.plans[key] = session.framework.prepare(build(), current_runtime_stream(session))
        _evict(session)
    return plan


def _evict(session: Session) -> None:
    """Keep the plan cache bounded: drop the oldest entries and free their constants."""
    while len(session.plans) > PLAN_CACHE_SIZE:
        _, old = session.plans.popitem(last=False)
        session.fast.clear()            # cached launches may hold the plan released here
        plan = old.plan if isinstance(old, _Native) else old
        if hasattr(plan, "release"):
            plan.release()


def materialize(session: Session, t: torch.Tensor, temps: list, stream) -> int:
    """The address of a contiguous device buffer holding ``t``'s elements (``t`` itself when
    it is contiguous; else a gathered copy kept alive in ``temps``)."""
    if t.is_contiguous():
        return T.address(t, session)
    dt = TORCH_TO_DTYPE[t.dtype]
    shape, stride = tuple(t.shape), tuple(t.stride())
    plan = _cached_plan(session, ("gather", shape, stride, dt),
                        lambda: _strided.gather_graph(shape, stride, dt))
    out = T.empty(shape, t.dtype, session=session)
    temps.append(out)
    plan([T.address(t, session)], [T.address(out, session)], stream)
    return T.address(out, session)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` for fornax tensors and CPU sources: broadcast, cast, any strides."""
    session = current()
    if not T.is_fornax(src):
        T.write(dst, src)
        return dst
    if not T.is_fornax(dst):
        dst.copy_(T.read(src))
        return dst
    if dst.numel() == 0:
        return dst
    if _mathbits.flagged(src) or _mathbits.flagged(dst):
        return _mathbits.copy(dst, src.expand(dst.shape), copy_into, _unary(session))
    src = src.expand(dst.shape)
    stream = current_runtime_stream(session)
    if src.dtype == dst.dtype and src.is_contiguous() and dst.is_contiguous():
        if T.address(src, session) != T.address(dst, session):
            session.runtime.memcpy_d2d(T.address(dst, session), T.address(src, session),
                                       dst.numel() * dst.element_size(), stream)
        return dst
    if src.dtype not in TORCH_TO_DTYPE or dst.dtype not in TORCH_TO_DTYPE:
        T.write(dst, T.read(src))                      # through the host: no graph dtype for it
        return dst
    shape = tuple(dst.shape)
    sd, dd = TORCH_TO_DTYPE[src.dtype], TORCH_TO_DTYPE[dst.dtype]
    key = ("copy", shape, tuple(src.stride()), sd, dd, tuple(dst.stride()))
    plan = _cached_plan(session, key, lambda: _strided.convert_graph(
        shape, tuple(src.stride()), sd, dd, tuple(dst.stride())))
    if tuple(dst.stride()) == T.contiguous_strides(shape) or \
            _strided.dense_permutation(shape, tuple(dst.stride())) is not None:      # as convert_graph tests
        # the plan writes the destination's elements in address order, from its first one
        plan([T.address(src, session)], [T.address(dst, session)], stream)
        return dst
    span_bytes = T.span_elements(shape, dst.stride()) * dst.element_size()
    tmp = T.new_storage(span_bytes, session)
    tmp_ptr = session.address(tmp.data_ptr())
    plan([T.address(src, session), T.address(dst, session)], [tmp_ptr], stream)
    session.runtime.memcpy_d2d(T.address(dst, session), tmp_ptr, span_bytes, stream)
    del tmp
    return dst


# ---------------------------------------------------------------------------------------------
# decomposition and CPU fallback
def _decompose(session: Session, info: OpInfo, op, args, kwargs, reason: str):
    fn = _decompositions().get(op)
    active = getattr(_local, "decomposing", None)
    if active is None:
        active = _local.decomposing = set()
    if fn is None or op in active:
        return NotImplemented
    active.add(op)
    try:
        out = fn(*args, **kwargs)
    finally:
        active.discard(op)
    if out is NotImplemented:
        return NotImplemented
    session.stats.record(info.name, "decomposed", f"{reason}; PyTorch's decomposition runs instead")
    return out


_DECOMPS: dict | None = None


def _decompositions() -> dict:
    """PyTorch's ATen-level decompositions: the core ATen set, plus those of
    ``torch._decomp.decompositions`` for core ops themselves (``_softmax``, ``mean.dim``:
    what a family that decomposes them on purpose needs).  The prims-based references of
    the global table are left out: they would send ``prims`` ops down here."""
    global _DECOMPS
    if _DECOMPS is None:
        from torch._decomp import core_aten_decompositions, decomposition_table
        _DECOMPS = {op: fn for op, fn in decomposition_table.items()
                    if getattr(fn, "__module__", "").startswith("torch._decomp")}
        _DECOMPS.update(core_aten_decompositions())
        from .corrected import DECOMPOSITIONS
        _DECOMPS.update(DECOMPOSITIONS)       # where PyTorch's own computes something else
    return _DECOMPS
