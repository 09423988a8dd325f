"""``fornax.frameworks.jax.jit`` and the default client.

``jit(f)`` traces ``f`` to a jaxpr at the arguments' avals, compiles it into a
fornax program for a client (:mod:`.program`), uploads the arguments, executes,
downloads the results and hands back jax arrays (numpy arrays with
``numpy=True``).  Programs are cached per argument structure and avals (shape,
dtype, weak type), static arguments and the x64 flag, as ``jax.jit`` caches.

Transformations inside work by construction (``jit(jax.grad(f))``: the jaxpr
is the gradient's).  Applied outside (``jax.grad(jit(f))``, ``jax.vmap(jit(f))``),
the call sees tracers: it then becomes a ``jax.custom_vjp`` whose primal,
forward and backward each run on fornax through ``jax.pure_callback`` — the
backward as ``jax.vjp`` of ``f`` compiled by fornax, and under ``vmap`` the
callback gets batched arguments and runs ``jax.vmap(f)`` compiled by fornax.
Forward-mode differentiation of the outside form (``jax.jvp``/``jacfwd``) is not
available, as for any ``custom_vjp`` function.

The default client comes from :func:`use_stack`, else ``FORNAX_CONFIG`` (a
stack TOML file) or ``FORNAX_VENDOR``, else cuda-like.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import weakref
from collections import OrderedDict

import jax
import numpy as np
from jax.sharding import Mesh

from ...layers.errors import ConfigError, InvalidArgumentError
from ...stack import Stack, compose, load_config, make_config
from . import lowering as L
from .mesh import require_devices
from .pjrt import Buffer, Client
from .program import build_program

_lock = threading.Lock()
_default: Client | None = None


def use_stack(vendor: str | None = None, *, config: str | None = None, spec: str | None = None,
              seams: dict[str, str] | None = None, devices: int | None = None,
              topology: str | None = None, stack: Stack | None = None) -> Client:
    """Compose the stack the default client runs on (all seams from ``vendor``, a TOML
    ``config`` file, per-seam overrides, a chip ``spec``, ``devices`` simulated devices joined
    by a ``topology``), or adopt a composed ``stack``."""
    global _default
    if stack is None:
        base = load_config(config) if config else None
        if vendor is None and base is None and not seams:
            raise ConfigError("use_stack() needs a vendor, a config file, seams or a stack",
                              hint="e.g. use_stack('rocm-like') or use_stack(config='stack.toml')")
        stack = compose(make_config(vendor, seams, spec=spec, base=base, devices=devices,
                                    topology=topology))
        origin = f"use_stack({vendor or config or seams})"
    else:
        origin = "use_stack(stack=...)"
    with _lock:
        _default = Client(stack, origin)
        return _default


def client() -> Client:
    """The default client, composed on first use."""
    global _default
    if _default is None:
        with _lock:
            if _default is None:
                config, vendor = os.environ.get("FORNAX_CONFIG"), os.environ.get("FORNAX_VENDOR")
                if config:
                    cfg, origin = make_config(vendor, base=load_config(config)), f"FORNAX_CONFIG={config}"
                else:
                    cfg = make_config(vendor or "cuda-like")
                    origin = f"FORNAX_VENDOR={vendor}" if vendor else "default (cuda-like)"
                _default = Client(compose(cfg), origin)
    return _default


def resolve(stack) -> Client:
    """A client from what ``jit(..., stack=)`` accepts: None (the default client), a vendor
    name, a composed Stack, or a Client."""
    if stack is None:
        return client()
    if isinstance(stack, Client):
        return stack
    if isinstance(stack, Stack):
        with _lock:
            c = stack.frontends.get("jax")
            if c is None:
                c = stack.frontends["jax"] = Client(stack, "jit(stack=Stack)")
        return c
    if isinstance(stack, str):
        return _vendor_client(stack)
    raise InvalidArgumentError(f"stack must be None, a vendor name, a Stack or a Client, got "
                               f"{type(stack).__name__}", seam="framework")


@functools.lru_cache(maxsize=None)
def _vendor_client(vendor: str) -> Client:
    return Client.for_vendor(vendor)


def devices(stack=None) -> list:
    """Every simulated device of the client's stack (``jax.devices()`` for fornax)."""
    return resolve(stack).devices()


def mesh(shape, axis_names, stack=None) -> Mesh:
    """A ``jax.sharding.Mesh`` of ``shape`` named ``axis_names`` over the first
    ``prod(shape)`` devices of the client's stack, in order (``jax.make_mesh`` for fornax);
    ``jax.shard_map`` programs over it run on those devices under :func:`jit`."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    c = resolve(stack)
    if len(shape) != len(names) or not all(isinstance(n, int) and n >= 1 for n in shape):
        raise InvalidArgumentError(f"mesh shape {shape} and axis names {names} must pair up, one "
                                   "positive size per name", seam="framework",
                                   hint="e.g. fj.mesh((2, 2), ('data', 'model'))")
    need = math.prod(shape)
    require_devices(c, f"a mesh of shape {shape}", need)
    return Mesh(np.array(c.devices()[:need], dtype=object).reshape(shape), names)


def device_put(x, device=None, stack=None):
    """Put a host value (or every leaf of a pytree) in device memory: buffers."""
    c = device.client if device is not None else resolve(stack)
    return jax.tree_util.tree_map(lambda v: v if isinstance(v, Buffer) else c.buffer_from_pyval(v, device), x)


def _is_tracer(x) -> bool:
    return isinstance(x, jax.core.Tracer)


class Jitted:
    """A function compiled by fornax per argument signature (see the module docstring)."""

    def __init__(self, fn, stack=None, static_argnums=(), numpy: bool = False, cache_size: int = 64):
        self.fn = fn
        self._stack = stack
        self.static_argnums = tuple(sorted({static_argnums} if isinstance(static_argnums, int)
                                           else set(static_argnums)))
        self.numpy = numpy
        self.cache: OrderedDict = OrderedDict()
        self.cache_size = cache_size
        self._traced_fns: dict = {}          # signature -> the callback functions (see _traced)
        # name and docs only: a wrapped object's own attributes (a pmap's lower) must not
        # shadow this class's methods
        functools.update_wrapper(self, fn, updated=())

    @property
    def client(self) -> Client:
        return resolve(self._stack)

    def _split(self, args):
        n = len(args)
        for i in self.static_argnums:
            if i >= n:
                raise InvalidArgumentError(f"static_argnums names argument {i} but the call passes {n}",
                                           seam="framework")
        statics = tuple((i, args[i]) for i in self.static_argnums)
        dyn = tuple(a for i, a in enumerate(args) if i not in self.static_argnums)
        return dyn, statics

    def _bound(self, statics):
        fn = self.fn
        if not statics:
            return fn

        def bound(*dyn):
            it = iter(dyn)
            full, st = [], dict(statics)
            for i in range(len(dyn) + len(st)):
                full.append(st[i] if i in st else next(it))
            return fn(*full)
        return bound

    def lower(self, *args):
        """(program, output tree) for these arguments, compiled once per signature."""
        dyn, statics = self._split(args)
        leaves, tree = jax.tree_util.tree_flatten(dyn)
        avals = []
        for i, a in enumerate(leaves):
            try:
                avals.append(a.aval if isinstance(a, Buffer) else jax.typeof(a))
            except TypeError:
                raise InvalidArgumentError(
                    f"argument leaf {i} is a {type(a).__name__}, not an array or scalar",
                    seam="framework", hint="pass arrays, or name the argument in static_argnums") from None
        try:
            key = (tree, tuple((a.shape, a.dtype, getattr(a, "weak_type", False)) for a in avals),
                   statics, bool(jax.config.jax_enable_x64))
            hash(key)
        except TypeError:
            raise InvalidArgumentError("static arguments must be hashable", seam="framework") from None
        client = self.client
        entry = self.cache.get((id(client), key))
        if entry is not None:
            self.cache.move_to_end((id(client), key))
            return entry
        fn = self._bound(statics)
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
                   for a in avals]
        closed, out_shape = jax.make_jaxpr(lambda *xs: fn(*jax.tree_util.tree_unflatten(tree, xs)),
                                           return_shape=True)(*structs)
        name = getattr(self.fn, "__name__", "fn")
        entry = (build_program(client, closed, name if name.isidentifier() else "fn"),
                 jax.tree_util.tree_structure(out_shape))
        self.cache[(id(client), key)] = entry
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return entry

    def __call__(self, *args):
        dyn, statics = self._split(args)
        leaves = jax.tree_util.tree_leaves(dyn)
        if any(_is_tracer(x) for x in leaves):
            return self._traced(args)
        prog, out_tree = self.lower(*args)
        client = prog.client
        with client.lock:
            bufs = [x if isinstance(x, Buffer) and x.placement is client.home
                    else client.value_from_pyval(x.to_numpy() if isinstance(x, Buffer) else x, r.aval)
                    for x, r in zip(leaves, prog.ins)]
            client.counts["executions"] += 1
            outs = prog.run(bufs)
            host = [b.to_numpy() for b in outs]
        if not self.numpy:
            host = [h if L.is_key(b.aval.dtype) else jax.numpy.asarray(h) for h, b in zip(host, outs)]
        return jax.tree_util.tree_unflatten(out_tree, host)

    # -- under a jax transformation ---------------------------------------------------------------
    def _traced(self, args):
        dyn, statics = self._split(args)
        leaves, tree = jax.tree_util.tree_flatten(dyn)
        floats = tuple(jax.dtypes.issubdtype(jax.typeof(x).dtype, np.inexact) for x in leaves)
        key = (tree, statics, floats)
        fns = self._traced_fns.get(key)
        if fns is None:
            fns = self._traced_fns[key] = _callback_fns(self._bound(statics), tree, floats)
        flat_fn, grads = fns
        stack = self._stack
        out_tree = jax.tree_util.tree_structure(jax.eval_shape(flat_fn, *leaves))
        idx = [i for i, f in enumerate(floats) if f]

        @jax.custom_vjp
        def call(*xs):
            return _on_fornax(flat_fn, xs, stack)

        def fwd(*xs):
            return _on_fornax(flat_fn, xs, stack), xs

        def bwd(xs, cts):
            gs = _on_fornax(grads, (list(xs), cts), stack) if idx else ()
            out = [None] * len(xs)
            for i, v in zip(idx, gs):
                out[i] = v
            return tuple(out)
        call.defvjp(fwd, bwd)
        return jax.tree_util.tree_unflatten(out_tree, jax.tree_util.tree_leaves(call(*leaves)))


def _callback_fns(fn, tree, floats):
    """The two functions a jitted call runs through callbacks under a transformation: ``f``
    on the flat arguments, and its vector-Jacobian product with respect to the floating
    arguments.  Every argument is passed in (none closed over: under an outer jit they are
    tracers), so one pair serves every call of a signature and its compiled programs are
    reused."""
    idx = [i for i, f in enumerate(floats) if f]

    def flat_fn(*xs):
        return fn(*jax.tree_util.tree_unflatten(tree, xs))

    def grads(all_xs, cts):
        def g(*fx):
            full = list(all_xs)
            for i, v in zip(idx, fx):
                full[i] = v
            return flat_fn(*full)
        return jax.vjp(g, *(all_xs[i] for i in idx))[1](cts)
    return flat_fn, grads


#: per callback function, the fornax programs that run it (by batch rank and argument tree)
_callback_jits: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _on_fornax(fn, args, stack):
    """``fn(*args)`` compiled and run by fornax through a host callback (works under jit,
    vmap and inside custom_vjp rules); returns fn's result pytree.  The compiled programs
    are kept per ``fn``, so repeated calls (a training loop) reuse them."""
    shapes = jax.eval_shape(fn, *args)
    flat_args, args_tree = jax.tree_util.tree_flatten(args)
    ranks = [np.ndim(x) for x in flat_args]

    def host(*xs):
        # under vmap ("broadcast_all") every argument gains the same leading batch dims
        extra = np.ndim(xs[0]) - ranks[0] if xs else 0
        jits = _callback_jits.setdefault(fn, {})
        j = jits.get((extra, args_tree))
        if j is None:
            g = fn
            for _ in range(extra):
                g = jax.vmap(g)
            j = jits[(extra, args_tree)] = Jitted(
                lambda *a: g(*jax.tree_util.tree_unflatten(args_tree, a)), stack, numpy=True)
        return jax.tree_util.tree_map(np.asarray, j(*xs))
    return jax.pure_callback(host, shapes, *flat_args, vmap_method="broadcast_all")


def jit(fn=None, *, stack=None, static_argnums=(), numpy: bool = False):
    """Compile ``fn`` with fornax (see the module docstring); usable as ``@jit`` or
    ``jit(f, stack="rocm-like")``."""
    if fn is None:
        return lambda f: Jitted(f, stack, static_argnums, numpy)
    return Jitted(fn, stack, static_argnums, numpy)
