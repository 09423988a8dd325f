"""Fast paths: whole launches of known kernels as a handful of vectorised numpy calls.

A replayed launch (:mod:`.replay`) still steps through its tape instruction by
instruction, and a tiled GEMM's tape is its K loop: per iteration, index arithmetic, two
masked tile loads and one batch of tile products.  A kernel whose program says what it
is (``meta["fast"]``, set by the library that built it) can instead run here: the same
tiles are cut from the operands at once, every iteration's tile products are one numpy
``matmul`` over all program instances (the same 2-D products, of the same shapes and
strides, as the interpreter's) -- or, for a launch shape where the first launch showed the
host's BLAS to give the same bits, one matmul of the whole K slab (:func:`_products`) --
accumulated in loop order, and the epilogue applies the same instructions' arithmetic to
every tile together.  So the result is the interpreter's bit for bit
(``tests/sim/test_gemm_fastpath.py`` checks it over shapes, dtypes, layouts and
epilogues), and the counters come from the launch's recording.

A generated kernel that is one scatter-add (``kind = "scatter_add"``, set by the compiler's
code generator) runs here too: its pull form walks the update axis for every output
element, where ``np.add.at`` applies the same updates to each element in the same order
(:func:`_scatter_add`).

A fast path runs only when it can say in advance that nothing will fault: aligned
pointers, each operand inside one mapping, slice orders in range.  Anything else (or a
kernel variant it does not know, such as a GELU epilogue) returns ``None`` and the
launch replays its tape, which faults or computes exactly as the interpreter does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import isa
from .arithmetic import cast
from .host_blas import one_thread
from .counters import Counters
from .interpreter import BINARY, UNARY, Args, Grid, PointerDtypes
from .memory import AddressSpace, Mapping
from .tiles import LOW_PRECISION, Tile, compute_dtype, operand

#: elements one batch of tile products may hold (the K loop runs in as many batches as needed)
PRODUCT_ELEMENTS = 1 << 22
#: epilogue activations a fast path computes (others replay the tape)
_ACTIVATIONS = ("none", "relu", "silu")


def run(fast: dict[str, Any], grid: Grid, args: Args, space: AddressSpace,
        ptr_dtype: PointerDtypes) -> Counters | None:
    """Run a launch of a kernel described by ``fast``; returns what its data-dependent
    accesses touched (a :class:`Counters` holding their ranges; empty when it has none), or
    None when this launch must replay its tape instead."""
    kind = fast.get("kind")
    if kind != "scatter_add" and fast.get("act") not in _ACTIVATIONS:
        return None
    try:
        if kind == "gemm":
            return _gemm(fast, grid, args, space, ptr_dtype)
        if kind == "gemm_reduce":
            return _reduce(fast, grid, args, space, ptr_dtype)
        if kind == "scatter_add":
            return _scatter_add(fast, args, space, ptr_dtype)
    except _Decline:
        return None
    return None


class _Decline(Exception):
    """This launch cannot take the fast path (the tape then runs it)."""


# -- memory ---------------------------------------------------------------------------------
def _view(space: AddressSpace, base: int, dtype: np.dtype[Any], shape: tuple[int, ...],
          strides: tuple[int, ...]) -> tuple[Mapping, np.ndarray]:
    """An element view (strides in elements, none negative) of memory at ``base``, when every
    element it spans lies in one mapping and ``base`` is aligned."""
    isz = dtype.itemsize
    if base % isz or any(s < 0 for s in strides) or any(d <= 0 for d in shape):
        raise _Decline
    m = space.holding(*_span(base, dtype, shape, strides))
    if m is None:
        raise _Decline
    view = space.box(m, dtype, (base - m.va, shape, tuple(s * isz for s in strides)))
    return m, view


def _store(space: AddressSpace, base: int, dtype: np.dtype[Any], values: np.ndarray,
           strides: tuple[int, ...]) -> None:
    """Write ``values`` (cast to ``dtype``) at ``base`` with element ``strides``, deferred as
    every store is while a packet runs; the elements must be distinct."""
    isz = dtype.itemsize
    shape = values.shape
    if len(shape) > 1 and shape[0] > 1 and strides[0] < strides[1] * shape[1]:
        raise _Decline                  # batches that overlap: the tape stores them in order
    m, _ = _view(space, base, dtype, shape, strides)
    space.store_box(m, dtype, (base - m.va, shape, tuple(s * isz for s in strides)),
                    np.ascontiguousarray(cast(values, dtype)))


def _span(base: int, dtype: np.dtype[Any], shape: tuple[int, ...], strides: tuple[int, ...]
          ) -> tuple[int, int]:
    """The device bytes ``[lo, hi)`` a view of elements at ``base`` spans."""
    last = sum((d - 1) * s for d, s in zip(shape, strides))
    return base, base + (last + 1) * dtype.itemsize


# -- arithmetic as the interpreter's instructions do it ------------------------------------------
def _binary(fn: str, a: Tile, b: Tile) -> Tile:
    y = BINARY[fn](compute_dtype(a), compute_dtype(b))
    return y if y.dtype == np.bool_ else cast(y, a.dtype)


def _unary(fn: str, x: Tile) -> Tile:
    y = UNARY[fn](compute_dtype(x))
    return y if y.dtype == np.bool_ else cast(y, x.dtype)


def _scalar(args: Args, name: str, dtype: np.dtype[Any]) -> Tile:
    return np.array([args[name]], dtype=dtype)


def _int(args: Args, name: str) -> int:
    value = args[name]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise _Decline
    return int(value)


def _epilogue(fast: dict[str, Any], acc: Tile, args: Args, space: AddressSpace,
              ptr_dtype: PointerDtypes, z: int, m: int, n: int, sc: int) -> None:
    """Scale, alpha, beta * C, bias, activation, convert and store, over ``acc``'s valid
    ``[z, m, n]`` outputs (the masked-off lanes of edge tiles are never stored, and every
    step is element-wise)."""
    acc_dt = np.dtype(fast["acc"])
    out_dt = ptr_dtype["c"]
    x = acc
    if fast["scaled"]:
        x = _binary("mul", x, _scalar(args, "scale", acc_dt))
    alpha = _scalar(args, "alpha", acc_dt)
    if alpha[0] != 1:               # x * 1 is x bit for bit: x is a sum, never a signalling NaN
        x = _binary("mul", x, alpha)
    base = int(args["c"])
    if fast["beta"]:
        _, old = _view(space, base, out_dt, (z, m, n), (sc, n, 1))
        x = _binary("add", x, _binary("mul", operand(np.array(old), acc_dt), _scalar(args, "beta", acc_dt)))
    if fast["bias"]:
        _, bias = _view(space, int(args["bias"]), ptr_dtype["bias"], (n,), (1,))
        x = _binary("add", x, operand(np.array(bias).reshape(1, 1, n), acc_dt))
    act = fast["act"]
    if act == "relu":
        x = _unary("relu", x)
    elif act == "silu":
        x = _binary("mul", x, _unary("sigmoid", x))
    _store(space, base, out_dt, operand(x, out_dt), (sc, n, 1))


# -- the tiled GEMM -----------------------------------------------------------------------------
def _gemm(fast: dict[str, Any], grid: Grid, args: Args, space: AddressSpace,
          ptr_dtype: PointerDtypes) -> Counters:
    bm, bn, bk = fast["tile"]
    split = int(fast["split"])
    gx, gy, gz = grid
    m, n, k = _int(args, "m"), _int(args, "n"), _int(args, "k")
    sa, sb, sc = _int(args, "sa"), _int(args, "sb"), _int(args, "sc")
    if min(m, n, k) <= 0 or gx * bn < n or gy * bm < m or gz % split:
        raise _Decline
    batch = gz // split
    ks = _int(args, "ks") if split > 1 else k
    if ks <= 0:
        raise _Decline
    steps = -(-ks // bk)                       # iterations of the K loop
    acc_dt = np.dtype(fast["acc"])
    da, db = ptr_dtype["a"], ptr_dtype["b"]
    # the operands as stored: A is m x k (k x m transposed), B k x n (n x k transposed)
    a_shape, a_strides = ((batch, k, m), (sa, m, 1)) if fast["trans_a"] else ((batch, m, k), (sa, k, 1))
    b_shape, b_strides = ((batch, n, k), (sb, k, 1)) if fast["trans_b"] else ((batch, k, n), (sb, n, 1))
    _, a_view = _view(space, int(args["a"]), da, a_shape, a_strides)
    _, b_view = _view(space, int(args["b"]), db, b_shape, b_strides)
    c_lo, c_hi = _span(int(args["c"]), ptr_dtype["c"], (gz if split > 1 else batch, m, n),
                       (m * n if split > 1 else sc, n, 1))
    for lo, hi in (_span(int(args["a"]), da, a_shape, a_strides), _span(int(args["b"]), db, b_shape, b_strides)):
        if c_lo < hi and lo < c_hi:
            raise _Decline              # the output overlaps an operand: the tape keeps chunk order
    a_mat = a_view.transpose(0, 2, 1) if fast["trans_a"] else a_view       # batch x m x k
    b_mat = b_view.transpose(0, 2, 1) if fast["trans_b"] else b_view       # batch x k x n
    kp = steps * bk
    counts, tile = (gy, gx, steps), (bm, bn, bk)
    # whole tiles and K steps in every slice: the operands are their own tiles as stored (a
    # split-K slice is a view of its K range, instance z = batch * split + slice)
    direct = m == gy * bm and n == gx * bn and ks == kp and split * ks == k and not fast["tf32"]
    a_dir, b_dir = a_mat, b_mat
    if direct and split > 1:
        a_dir = a_mat.reshape(batch, m, split, ks).transpose(0, 2, 1, 3).reshape(gz, m, ks)
        b_dir = b_mat.reshape(batch, split, ks, n).reshape(gz, ks, n)
    key = _slab_key(a_dir, b_dir, tile, acc_dt)
    known = _DIRECT.get(key)
    if direct and known is not False:
        a_dir, b_dir = operand(a_dir, acc_dt), operand(b_dir, acc_dt)
        with one_thread():
            acc = _products(a_dir, b_dir, counts, tile, acc_dt)
        if known is None:
            # where the host BLAS does not sum a transposed or strided slab as it sums the
            # tiles (found on the first launch), later launches copy the operands into tiles
            _DIRECT[key] = _SLABS.get(_slab_key(a_dir, b_dir, tile, acc_dt), True)
            _forget_oldest(_DIRECT)
    else:
        acc, slab = _padded(a_mat, b_mat, fast, gz, split, ks, k, kp, counts, tile, acc_dt)
        if direct and known is False and slab is False:
            # the padded copies' slabs disagree too: both take the tile products, and the
            # operands in place need no copy to give them
            _DIRECT[key] = True
    acc = acc[:, :m, :n]
    if split > 1:
        # partials of slice s of batch b at ((b * split + s) * m * n)
        _store(space, int(args["c"]), ptr_dtype["c"], acc, (m * n, n, 1))
        return Counters()
    _epilogue(fast, acc, args, space, ptr_dtype, batch, m, n, sc)
    return Counters()               # every access of the kernel is static


def _padded(a_mat: Tile, b_mat: Tile, fast: dict[str, Any], gz: int, split: int, ks: int, k: int,
            kp: int, counts: tuple[int, int, int], tile: tuple[int, int, int],
            acc_dt: np.dtype[Any]) -> tuple[Tile, bool | None]:
    """The products of every instance's tiles as its masked loads give them (masked lanes
    hold 0), one row of K slices per instance z = batch * split + slice; and whether the
    padded layout's slabs agree with its tiles (:func:`_slab_agrees`)."""
    gy, gx, _ = counts
    bm, bn, _ = tile
    m, n = a_mat.shape[1], b_mat.shape[2]
    a_pad = np.zeros((gz, gy * bm, kp), dtype=a_mat.dtype)
    b_pad = np.zeros((gz, kp, gx * bn), dtype=b_mat.dtype)
    for s in range(split):
        k0 = s * ks
        kend = min(k, k0 + ks)
        if kend <= k0:
            continue
        a_pad[s::split, :m, :kend - k0] = a_mat[:, :, k0:kend]
        b_pad[s::split, :kend - k0, :n] = b_mat[:, k0:kend, :]
    if fast["tf32"]:
        a_pad, b_pad = _unary("tf32", a_pad), _unary("tf32", b_pad)
    a_pad, b_pad = operand(a_pad, acc_dt), operand(b_pad, acc_dt)
    with one_thread():
        acc = _products(a_pad, b_pad, counts, tile, acc_dt)
    return acc, _SLABS.get(_slab_key(a_pad, b_pad, tile, acc_dt))


def _bits(x: Tile) -> Tile:
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def _forget_oldest(memo: dict[Any, bool]) -> None:
    if len(memo) > 4096:               # launch shapes that keep changing: forget the oldest
        del memo[next(iter(memo))]


#: (dtype, operand shapes and strides, tile) -> whether the slab products of that layout
#: agree with the tile products bit for bit (:func:`_slab_agrees`)
_SLABS: dict[tuple[Any, ...], bool] = {}
#: (dtype, operand shapes and strides as stored, tile) -> whether operands that need no
#: padding are multiplied in place: where their slabs agree with the tile products, or where
#: neither their slabs nor padded copies' do (both take the tile products then)
_DIRECT: dict[tuple[Any, ...], bool] = {}


def _slab_key(a: Tile, b: Tile, tile: tuple[int, int, int], acc_dt: np.dtype[Any]) -> tuple[Any, ...]:
    return (acc_dt.str, a.shape, a.strides, b.shape, b.strides, tile)


def _products(a_pad: Tile, b_pad: Tile, counts: tuple[int, int, int], tile: tuple[int, int, int],
              acc_dt: np.dtype[Any]) -> Tile:
    """The accumulators of every tile, ``z x (rows * bm) x (columns * bn)``: per K step, the
    sum so far plus that step's tile products, in loop order.

    The interpreter's products are 2-D matmuls of one ``bm x bk`` and one ``bk x bn`` tile.
    A K step's products for every tile together are also one ``(rows * bm) x bk`` by
    ``bk x (columns * bn)`` matmul (a slab), whose every element sums the same ``bk``
    products; whether the host's BLAS sums them in the same order for both shapes is
    checked once per operand layout (:func:`_slab_agrees`).  Layouts where it does take the
    slab: ``steps`` matmuls instead of ``steps x tiles``."""
    key = _slab_key(a_pad, b_pad, tile, acc_dt)
    slab = _SLABS.get(key)
    if slab is None:
        slab = _SLABS[key] = _slab_agrees(a_pad, b_pad, counts, tile, acc_dt)
        _forget_oldest(_SLABS)
    if not slab:
        return _tile_products(a_pad, b_pad, counts, tile, acc_dt)
    return _slab_products(a_pad, b_pad, counts, tile, acc_dt)


def _slab_products(a_pad: Tile, b_pad: Tile, counts: tuple[int, int, int],
                   tile: tuple[int, int, int], acc_dt: np.dtype[Any]) -> Tile:
    """:func:`_products` as one slab matmul per K step."""
    gy, gx, steps = counts
    bm, bn, bk = tile
    acc = np.zeros((a_pad.shape[0], gy * bm, gx * bn), dtype=acc_dt)
    for s in range(steps):
        p = np.matmul(a_pad[:, :, s * bk:(s + 1) * bk], b_pad[:, s * bk:(s + 1) * bk, :])
        if p.dtype != acc.dtype:
            raise _Decline              # the loop's sum would promote: keep the tape's order
        np.add(acc, p, out=acc)         # the same rounding as acc + p
    return acc


def _probe(x: Tile, rng: np.random.Generator) -> Tile | None:
    """Random values of full precision laid out exactly as ``x`` (shape, strides, dtype), or
    None for a layout that cannot be rebuilt (a negative or partial-element stride)."""
    if any(s < 0 or s % x.itemsize for s in x.strides):
        return None
    span = sum((d - 1) * s for d, s in zip(x.shape, x.strides)) // x.itemsize + 1
    base = rng.standard_normal(max(span, 1)).astype(x.dtype)
    return np.lib.stride_tricks.as_strided(base, x.shape, x.strides, writeable=False)


def _slab_agrees(a_pad: Tile, b_pad: Tile, counts: tuple[int, int, int],
                 tile: tuple[int, int, int], acc_dt: np.dtype[Any]) -> bool:
    """Whether the host's BLAS gives a slab of this operand layout the tile products' bits.

    The summation order of a BLAS depends on the shapes and strides it is given, never on
    the values; but values whose products sum exactly (a launch's low-precision operands,
    small integers, zeros) agree in any order.  So both ways are computed once on random
    operands of full precision laid out as the launch's, where any difference in order shows."""
    if a_pad.size == 0 or b_pad.size == 0 or tile[2] == 1:
        return True                     # no sum, or one product per K step: nothing to order
    rng = np.random.default_rng(0)
    a, b = _probe(a_pad, rng), _probe(b_pad, rng)
    if a is None or b is None:
        return False
    slab = _slab_products(a, b, counts, tile, acc_dt)
    return bool(np.array_equal(_bits(slab), _bits(_tile_products(a, b, counts, tile, acc_dt))))


def _tile_products(a_pad: Tile, b_pad: Tile, counts: tuple[int, int, int],
                   tile: tuple[int, int, int], acc_dt: np.dtype[Any]) -> Tile:
    """:func:`_products` with the interpreter's own 2-D products, one per tile and K step."""
    gy, gx, steps = counts
    bm, bn, bk = tile
    gz = a_pad.shape[0]
    # z, tile row, K step, bm, bk  /  z, tile column, K step, bk, bn: each 2-D tile C-contiguous
    a_t = np.ascontiguousarray(a_pad.reshape(gz, gy, bm, steps, bk).transpose(0, 1, 3, 2, 4))
    b_t = np.ascontiguousarray(b_pad.reshape(gz, steps, bk, gx, bn).transpose(0, 3, 1, 2, 4))
    acc = np.zeros((gz, gy, gx, bm, bn), dtype=acc_dt)
    per = max(1, PRODUCT_ELEMENTS // max(1, gz * gy * gx * bm * bn))
    for first in range(0, steps, per):
        last = min(steps, first + per)
        # z, row, column, step, bm, bn: one matmul, a 2-D product per tile and step
        prods = np.matmul(a_t[:, :, None, first:last], b_t[:, None, :, first:last])
        if prods.dtype != acc.dtype:
            raise _Decline              # the loop's sum would promote: keep the tape's order
        for j in range(last - first):
            np.add(acc, prods[:, :, :, j], out=acc)      # the same rounding as acc + p
    return acc.transpose(0, 1, 3, 2, 4).reshape(gz, gy * bm, gx * bn)


def _reduce(fast: dict[str, Any], grid: Grid, args: Args, space: AddressSpace,
            ptr_dtype: PointerDtypes) -> Counters:
    """The split-K reduction: the partials of every output added in the order buffer's
    slice order, then the epilogue."""
    split = int(fast["split"])
    bm, bn, _ = fast["tile"]
    gx, gy, batch = grid
    m, n, sc = _int(args, "m"), _int(args, "n"), _int(args, "sc")
    if min(m, n) <= 0 or gx * bn < n or gy * bm < m:
        raise _Decline
    _, order = _view(space, int(args["order"]), ptr_dtype["order"], (split,), (1,))
    order = np.array(order, dtype=np.int64)
    if order.min() < 0 or order.max() >= split or len(set(order.tolist())) != split:
        raise _Decline
    acc_dt = np.dtype(fast["acc"])
    ws_dt = ptr_dtype["ws"]
    ws_base = int(args["ws"])
    _, parts = _view(space, ws_base, ws_dt, (batch, split, m, n), (split * m * n, m * n, n, 1))
    acc = np.zeros((batch, m, n), dtype=acc_dt)
    same = ws_dt == acc_dt and acc_dt.name not in LOW_PRECISION    # the add needs no widening
    for s in order.tolist():
        if same:
            np.add(acc, parts[:, s], out=acc)    # the same rounding as acc + part
        else:
            acc = _binary("add", acc, np.array(parts[:, s]))
    _epilogue(fast, acc, args, space, ptr_dtype, batch, m, n, sc)
    # the partials' loads sit at offsets read from the order buffer: what they touched
    live = Counters()
    live.read_ranges["ws"] = (ws_base, ws_base + batch * split * m * n * ws_dt.itemsize)
    return live


# -- the pull-form scatter-add ----------------------------------------------------------------------
#: element dtypes whose sums numpy's ``add.at`` rounds exactly as the interpreter's ``add`` does
_SCATTER_DTYPES = ("float32", "float64", "int32", "int64")


def _scatter_add(fast: dict[str, Any], args: Args, space: AddressSpace,
                 ptr_dtype: PointerDtypes) -> Counters:
    """The scatter-add kernel of :func:`fornax.layers.codegen_nn.emit_scatter`, whole.

    Each output element starts from the input and, walking the update axis in order, adds
    every update whose index names it.  ``np.add.at`` over the updates in row-major order
    applies, to each element, the updates that name it in that same order (two updates of one
    element differ only along the axis), one rounded ``add`` at a time; an index out of
    range names no element.  Every access is static (the indices are values, not addresses)."""
    x_shape, u_shape, axis = tuple(fast["x_shape"]), tuple(fast["upd_shape"]), int(fast["axis"])
    px, pi, pu, po = fast["x"], fast["index"], fast["upd"], fast["out"]
    dt = ptr_dtype[px]
    if str(dt) not in _SCATTER_DTYPES or ptr_dtype[pu] != dt or ptr_dtype[po] != dt:
        raise _Decline
    x_str, u_str = _row_major(x_shape), _row_major(u_shape)
    out_base = int(args[po])
    out_span = _span(out_base, dt, x_shape, x_str)
    for name, shape, st in ((px, x_shape, x_str), (pi, u_shape, u_str), (pu, u_shape, u_str)):
        lo, hi = _span(int(args[name]), ptr_dtype[name], shape, st)
        if lo < out_span[1] and out_span[0] < hi:
            raise _Decline              # the output overlaps an operand: the tape keeps lane order
    _, x = _view(space, int(args[px]), dt, x_shape, x_str)
    _, idx = _view(space, int(args[pi]), ptr_dtype[pi], u_shape, u_str)
    _, upd = _view(space, int(args[pu]), dt, u_shape, u_str)
    out = np.array(x)
    target = np.asarray(idx).astype(np.int64)
    hit = (target >= 0) & (target < x_shape[axis])
    where = list(np.nonzero(hit))           # the hits' coordinates, in row-major order
    where[axis] = target[hit]
    np.add.at(out, tuple(where), np.asarray(upd)[hit])
    _store(space, out_base, dt, out, x_str)
    return Counters()


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a C-contiguous tensor of ``shape``."""
    return tuple(int(s) for s in np.cumprod((1, *shape[:0:-1]))[::-1]) if shape else ()


def describe(kind: str, **fields: Any) -> dict[str, Any]:
    """The ``meta["fast"]`` entry a library or code generator puts on a kernel it builds."""
    need = {"gemm": _GEMM_FIELDS, "gemm_reduce": _GEMM_FIELDS,
            "scatter_add": ("x", "index", "upd", "out", "axis", "x_shape", "upd_shape")}.get(kind)
    if need is None:
        raise ValueError(f"no fast path for kernels of kind {kind!r}")
    for name in need:
        if name not in fields:
            raise ValueError(f"a {kind} fast path needs {name!r}")
    if kind != "scatter_add":
        isa.np_dtype(fields["acc"])
    return {"kind": kind, **fields}


_GEMM_FIELDS = ("acc", "tile", "split", "trans_a", "trans_b", "beta", "bias", "act", "tf32", "scaled")
