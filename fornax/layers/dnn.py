"""DNN-like library routines (cuDNN / MIOpen / oneDNN-like), shared by every family.

:class:`DnnRoutines` is mixed into :class:`~fornax.layers.library.LibraryBase`
(it builds on :class:`~fornax.layers.library_core.LibraryCore`, so it never
imports the seam module that composes it):
each routine checks its arguments, picks an algorithm from the family's
``[library.dnn]`` table (``vendor.toml``) and says why, builds its kernels
with :mod:`fornax.layers.codegen_dnn` (specialised for the problem geometry,
cached), packs them with the library's own encoder into the image shipped
for the device (the same image rules as GEMM: no image for the arch is a
``LibraryError``), loads them through the runtime's module cache and launches
them on a stream.  Every call is recorded (routine, the family's API name,
algorithm, reason) in the library report.

Tensors are device addresses of contiguous buffers: NCHW for convolution and
pooling, ``[batch, heads, seq, head_dim]`` for attention, ``[rows, cols]``
(normalised over ``cols``) for norms and softmax.  Saved statistics
(attention's log-sum-exp, the norms' mean and rstd) are float32.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..sim.isa import Program
from ..sim.spec import ChipSpec
from . import codegen_dnn as cg
from .binary import KernelBinary
from .call_record import CallRecord
from .codegen import next_pow2
from .driver import Module
from .library_core import LibraryCore
from .runtime import Runtime, Stream
from .tiling import choose_gemm_tile

#: routine -> the pass it runs ("fwd" / "bwd_data" / "bwd_weights" for convolution)
CONV_PASSES = {"conv2d_fwd": "fwd", "conv2d_bwd_data": "bwd_data", "conv2d_bwd_weights": "bwd_weights"}
POOL_BLOCK = 256


#: what :meth:`DnnRoutines._attention_setup` resolves: dtype, batch, heads, seq_q, seq_k,
#: head_dim, causal, scale, the chosen ``[library.dnn.attention]`` tile entry and why
AttentionSetup = tuple[str, int, int, int, int, int, bool, float, dict[str, Any], str]


def _tile3(tile: Sequence[int]) -> tuple[int, int, int]:
    """A ``[m, n, k]`` tile of the family's tables as a tuple."""
    return (tile[0], tile[1], tile[2])


def _tile2(tile: Sequence[int]) -> tuple[int, int]:
    """A ``[query, key]`` attention tile of the family's tables as a tuple."""
    return (tile[0], tile[1])


def _tag(geometry: dict[str, Any]) -> str:
    """A short stable name for a problem geometry (kernel names are the same in every run)."""
    return hashlib.sha1(repr(sorted(geometry.items())).encode()).hexdigest()[:10]


class DnnRoutines(LibraryCore):
    """Convolution, attention, norms, softmax and pooling on a library (mixin for LibraryBase)."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        #: (kind, kernel name, format, target) -> the packed image (built once per library)
        self._dnn_images: dict[tuple[str, ...], KernelBinary] = {}

    # -- shared plumbing --------------------------------------------------------------------
    @property
    def dnn(self) -> dict[str, Any]:
        """The family's ``[library.dnn]`` table; a LibraryError when it has none."""
        facts: dict[str, Any] | None = self.facts["library"].get("dnn")
        if facts is None:
            raise self._error(f"{self.name} has no DNN routines (no [library.dnn] table)")
        return facts

    def _dnn_dtype(self, routine: str, params: dict[str, Any]) -> str:
        dtype: str = params.get("dtype", "float32")
        dtype = getattr(dtype, "value", dtype)
        if dtype not in self.dnn["dtypes"]:
            raise self._error(f"{routine} does not support dtype {dtype!r} "
                              f"(supports {', '.join(self.dnn['dtypes'])})")
        return dtype

    def _positive(self, routine: str, **sizes: Any) -> tuple[int, ...]:
        """The sizes, in the order given, once each is checked to be a positive int."""
        bad = {k: v for k, v in sizes.items()
               if not isinstance(v, int) or isinstance(v, bool) or v <= 0}
        if bad:
            raise self._error(f"{routine}: sizes must be positive integers, got "
                              + ", ".join(f"{k}={v!r}" for k, v in bad.items()))
        return tuple(sizes.values())

    def _api(self, routine: str) -> str:
        api: str = self.dnn["routines"][routine]
        return api

    def _units(self) -> int:
        return self.runtime.driver.properties(self.runtime.current_device()).compute_units

    def _dnn_module(self, key: tuple[str, ...],
                    build: Callable[[], Iterable[Program]]) -> tuple[Module, str]:
        """Load (building once) the image holding ``build()``'s programs for this device."""
        dev = self.runtime.current_device()
        props = self.runtime.driver.properties(dev)
        image = self._image_for(props.target, self.runtime.driver.loadable_formats(dev))
        cache = self._dnn_images
        full = key + (image["format"], image["target"])
        if full not in cache:
            cache[full] = self.build(list(build()), image["format"], image["target"])
        return self.runtime.load_module(cache[full]), f"{image['format']}:{image['target']}"

    def _record(self, routine: str, algorithm: str, reason: str, image: str,
                shape: tuple[int, ...]) -> CallRecord:
        rec = CallRecord(routine, algorithm, f"{self._api(routine)}: {reason}", image, tuple(shape))
        self.calls.append(rec)
        return rec

    def _fill(self, ptr: int, count: int, dtype: str, stream: Stream | None) -> None:
        """Zero ``count`` elements (the clear a deterministic ``store_reduce`` needs first)."""
        block = 1024
        name = f"{self.name}_fill_{dtype}"
        module, _ = self._dnn_module(("fill", dtype), lambda: [
            cg.fill_kernel(name, dtype, 0.0, block, self.group_size)])
        self.runtime.launch(module, name, (math.ceil(count / block), 1, 1), {"out": ptr, "n": count},
                            stream)

    def _fits(self, shared: int) -> bool:
        """Whether ``shared`` bytes of tiles fit one compute unit's shared memory."""
        spec: ChipSpec = self.runtime.driver.device_spec(self.runtime.current_device())
        return shared <= spec.shared_memory_per_unit

    # -- convolution ----------------------------------------------------------------------------
    def _conv(self, routine: str, ptrs: dict[str, int], params: dict[str, Any],
              stream: Stream | None) -> CallRecord:
        pass_ = CONV_PASSES[routine]
        dtype = self._dnn_dtype(routine, params)
        p = dict(params)
        for key in ("stride", "padding", "dilation"):
            v = p.get(key, 1 if key != "padding" else 0)
            p[key] = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
        p.setdefault("groups", 1)
        try:
            self._positive(routine, **{k: p[k] for k in ("n", "c", "h", "w", "k", "r", "s", "groups")})
        except KeyError as exc:
            raise self._error(f"{routine}: missing size {exc.args[0]!r} (needs n, c, h, w, k, r, s)") from None
        if any(not isinstance(v, int) or v < (0 if key == "padding" else 1)
               for key in ("stride", "padding", "dilation") for v in p[key]) or \
                any(len(p[key]) != 2 for key in ("stride", "padding", "dilation")):
            raise self._error(f"{routine}: stride and dilation must be positive and padding "
                              f"non-negative pairs, got stride={p['stride']} padding={p['padding']} "
                              f"dilation={p['dilation']}")
        if p["c"] % p["groups"] or p["k"] % p["groups"]:
            raise self._error(f"{routine}: groups={p['groups']} must divide channels c={p['c']} "
                              f"and k={p['k']}")
        g = cg.conv_geometry(p)
        if g["p_out"] <= 0 or g["q_out"] <= 0:
            raise self._error(f"{routine}: the {p['r']}x{p['s']} filter (dilation {p['dilation']}) "
                              f"does not fit the padded {p['h']}x{p['w']} input",
                              hint="use more padding or a smaller filter")
        M, N, K = cg.conv_gemm_shape(pass_, g)
        algos = self.dnn["conv"][pass_]
        item = 2 if dtype in ("float16", "bfloat16") else 4
        fits = [a for a in algos if self._fits((a["tile"][0] * a["tile"][2] + a["tile"][2] * a["tile"][1]) * item)]
        i, why = choose_gemm_tile(M, N, g["groups"], self._units(), [_tile3(a["tile"]) for a in fits])
        algo = fits[i]
        name = f"{self.name}_conv2d_{pass_}_{dtype}_{_tag(g)}_{algo['name']}"
        module, image = self._dnn_module(("conv", name), lambda: [
            cg.conv2d_kernel(name, pass_, dtype, g, _tile3(algo["tile"]), self.group_size)[0]])
        bm, bn, _ = (min(t, next_pow2(v)) for t, v in zip(algo["tile"], (M, N, K)))
        grid = (math.ceil(N / bn), math.ceil(M / bm), g["groups"])
        self.runtime.launch(module, name, grid, ptrs, stream)
        return self._record(routine, algo["name"], f"implicit GEMM {M}x{N}x{K} x {g['groups']} "
                            f"group(s); {why}", image,
                            (p["n"], p["c"], p["h"], p["w"], p["k"], p["r"], p["s"]))

    def conv2d_fwd(self, x: int, w: int, y: int, params: dict[str, Any],
                   stream: Stream | None = None) -> CallRecord:
        """``y = conv2d(x, w)``: x [n, c, h, w], w [k, c/groups, r, s], y [n, k, p, q].  ``params``:
        n, c, h, w, k, r, s, stride, padding, dilation (ints or pairs), groups, dtype."""
        return self._conv("conv2d_fwd", {"x": x, "w": w, "y": y}, params, stream)

    def conv2d_bwd_data(self, dy: int, w: int, dx: int, params: dict[str, Any],
                        stream: Stream | None = None) -> CallRecord:
        """``dx`` (the input gradient) from dy [n, k, p, q] and w; params as :meth:`conv2d_fwd`."""
        return self._conv("conv2d_bwd_data", {"dy": dy, "w": w, "dx": dx}, params, stream)

    def conv2d_bwd_weights(self, x: int, dy: int, dw: int, params: dict[str, Any],
                           stream: Stream | None = None) -> CallRecord:
        """``dw`` (the filter gradient) from x and dy; params as :meth:`conv2d_fwd`."""
        return self._conv("conv2d_bwd_weights", {"x": x, "dy": dy, "dw": dw}, params, stream)

    # -- attention ---------------------------------------------------------------------------------
    def _attention_setup(self, routine: str, params: dict[str, Any], backward: bool) -> AttentionSetup:
        dtype = self._dnn_dtype(routine, params)
        sq = params.get("seq_q")
        b, h, sq, sk, d = self._positive(routine, batch=params.get("batch", 1),
                                         heads=params.get("heads", 1), seq_q=sq,
                                         seq_k=params.get("seq_k", sq), head_dim=params.get("head_dim"))
        att = self.dnn["attention"]
        if d not in att["head_dims"]:
            raise self._error(f"{routine}: head dim {d} is not supported "
                              f"(supported: {', '.join(map(str, att['head_dims']))})",
                              hint="pad the head dim to a supported size")
        causal = bool(params.get("causal", False))
        scale = float(params.get("scale", 1.0 / math.sqrt(d)))
        item = 2 if dtype in ("float16", "bfloat16") else 4
        fits = [t for t in att["tiles"]
                if self._fits(cg.attention_shared_bytes(t["tile"][0], t["tile"][1], d, item, backward))]
        if not fits:
            raise self._error(f"{routine}: no attention tile for head dim {d} fits the device's "
                              "shared memory")
        # the grid runs over query tiles (forward) or key tiles (backward): the shared GEMM tile
        # rule picks the largest such tile that still fills the device
        if not backward:
            tiles = [(t["tile"][0], d, t["tile"][1]) for t in fits]
            i, why = choose_gemm_tile(sq, d, b * h, self._units(), tiles)
        else:
            tiles = [(t["tile"][1], d, t["tile"][0]) for t in fits]
            i, why = choose_gemm_tile(sk, d, b * h, self._units(), tiles)
        return dtype, b, h, sq, sk, d, causal, scale, fits[i], why

    def attention_fwd(self, q: int, k: int, v: int, o: int, lse: int, params: dict[str, Any],
                      stream: Stream | None = None) -> CallRecord:
        """Flash attention forward: ``o = softmax(scale q k^T [causal]) v`` and the row
        log-sum-exp ``lse`` [batch, heads, seq_q] (float32) the backward needs.  ``params``:
        batch, heads, seq_q, seq_k, head_dim, causal, scale (default 1/sqrt(head_dim)), dtype.
        A causal mask keeps key j <= query i (top-left aligned)."""
        dtype, b, h, sq, sk, d, causal, scale, algo, why = self._attention_setup(
            "attention_fwd", params, False)
        name = (f"{self.name}_attn_fwd_{dtype}_{sq}x{sk}x{d}_{'causal' if causal else 'full'}_"
                f"{_tag({'scale': scale})}_{algo['name']}")
        module, image = self._dnn_module(("attn", name), lambda: [
            cg.attention_fwd_kernel(name, dtype, sq, sk, d, causal, scale, _tile2(algo["tile"]),
                                    self.group_size)[0]])
        bm = min(algo["tile"][0], next_pow2(sq))
        self.runtime.launch(module, name, (math.ceil(sq / bm), b * h, 1),
                            {"q": q, "k": k, "v": v, "o": o, "lse": lse}, stream)
        return self._record("attention_fwd", algo["name"],
                            f"flash, one kernel, online softmax over {math.ceil(sk / algo['tile'][1])} "
                            f"K/V tile(s){', causal' if causal else ''}; {why}", image, (b, h, sq, sk, d))

    def attention_bwd(self, q: int, k: int, v: int, o: int, do: int, lse: int,
                      dq: int, dk: int, dv: int, params: dict[str, Any],
                      stream: Stream | None = None) -> CallRecord:
        """Flash attention backward: dq, dk, dv from q, k, v, the forward's o and lse, and do.
        dq is cleared and accumulated deterministically; params as :meth:`attention_fwd`."""
        dtype, b, h, sq, sk, d, causal, scale, algo, why = self._attention_setup(
            "attention_bwd", params, True)
        name = (f"{self.name}_attn_bwd_{dtype}_{sq}x{sk}x{d}_{'causal' if causal else 'full'}_"
                f"{_tag({'scale': scale})}_{algo['name']}")
        module, image = self._dnn_module(("attn", name), lambda: [
            cg.attention_bwd_kernel(name, dtype, sq, sk, d, causal, scale, _tile2(algo["tile"]),
                                    self.group_size)[0]])
        self._fill(dq, b * h * sq * d, dtype, stream)
        bn = min(algo["tile"][1], next_pow2(sk))
        self.runtime.launch(module, name, (math.ceil(sk / bn), b * h, 1),
                            {"q": q, "k": k, "v": v, "o": o, "do": do, "lse": lse,
                             "dq": dq, "dk": dk, "dv": dv}, stream)
        return self._record("attention_bwd", algo["name"],
                            f"flash backward, one kernel per K/V tile looping over "
                            f"{math.ceil(sq / algo['tile'][0])} query tile(s), dq by ordered "
                            f"reduction{', causal' if causal else ''}; {why}", image, (b, h, sq, sk, d))

    # -- norms and softmax ---------------------------------------------------------------------
    def _rows(self, routine: str, params: dict[str, Any]) -> tuple[str, int, int]:
        dtype = self._dnn_dtype(routine, params)
        rows, cols = self._positive(routine, rows=params.get("rows"), cols=params.get("cols"))
        limit = self.dnn["max_row"]
        if cols > limit:
            raise self._error(f"{routine}: rows of {cols} elements exceed the one-tile limit {limit}")
        return dtype, rows, cols

    def _row_call(self, routine: str, key: str, dtype: str, rows: int, cols: int,
                  build: Callable[[str], Program], args: dict[str, int], stream: Stream | None,
                  reason: str) -> CallRecord:
        name = f"{self.name}_{key}_{dtype}_{cols}"
        module, image = self._dnn_module(("row", name), lambda: [build(name)])
        self.runtime.launch(module, name, (rows, 1, 1), args, stream)
        return self._record(routine, self.dnn["row_algorithm"], reason, image, (rows, cols))

    def _norm_fwd(self, routine: str, kind: str, args: dict[str, int], params: dict[str, Any],
                  stream: Stream | None) -> CallRecord:
        dtype, rows, cols = self._rows(routine, params)
        eps = float(params.get("eps", 1e-5))
        name = f"{self.name}_{kind}norm_fwd_{dtype}_{cols}_{_tag({'eps': eps})}"
        module, image = self._dnn_module(("row", name), lambda: [
            cg.norm_fwd_kernel(name, kind, dtype, cols, eps, self.group_size)])
        self.runtime.launch(module, name, (rows, 1, 1), args, stream)
        return self._record(routine, self.dnn["row_algorithm"],
                            f"one row per work-group ({cols} elements in one tile), float32 statistics",
                            image, (rows, cols))

    def _norm_bwd(self, routine: str, kind: str, args: dict[str, int], params: dict[str, Any],
                  stream: Stream | None) -> CallRecord:
        dtype, rows, cols = self._rows(routine, params)
        for p in ("dgamma", "dbeta") if kind == "layer" else ("dgamma",):
            self._fill(args[p], cols, dtype, stream)
        return self._row_call(routine, f"{kind}norm_bwd", dtype, rows, cols,
                              lambda name: cg.norm_bwd_kernel(name, kind, dtype, cols, self.group_size),
                              args, stream, "one row per work-group; weight gradients summed over "
                              "rows by ordered reduction (deterministic)")

    def layer_norm_fwd(self, x: int, gamma: int, beta: int, y: int, mean: int, rstd: int,
                       params: dict[str, Any], stream: Stream | None = None) -> CallRecord:
        """``y = (x - mean) * rstd * gamma + beta`` over the last axis, saving mean and rstd
        (float32, one per row).  ``params``: rows, cols, eps (1e-5), dtype."""
        return self._norm_fwd("layer_norm_fwd", "layer", {"x": x, "gamma": gamma, "beta": beta, "y": y,
                                                          "mean": mean, "rstd": rstd}, params, stream)

    def layer_norm_bwd(self, dy: int, x: int, gamma: int, mean: int, rstd: int, dx: int,
                       dgamma: int, dbeta: int, params: dict[str, Any],
                       stream: Stream | None = None) -> CallRecord:
        """dx, dgamma and dbeta of :meth:`layer_norm_fwd` from the saved mean and rstd."""
        return self._norm_bwd("layer_norm_bwd", "layer",
                              {"dy": dy, "x": x, "gamma": gamma, "mean": mean, "rstd": rstd, "dx": dx,
                               "dgamma": dgamma, "dbeta": dbeta}, params, stream)

    def rms_norm_fwd(self, x: int, gamma: int, y: int, rstd: int, params: dict[str, Any],
                     stream: Stream | None = None) -> CallRecord:
        """``y = x * rsqrt(mean(x^2) + eps) * gamma`` over the last axis, saving rstd."""
        return self._norm_fwd("rms_norm_fwd", "rms", {"x": x, "gamma": gamma, "y": y, "rstd": rstd},
                              params, stream)

    def rms_norm_bwd(self, dy: int, x: int, gamma: int, rstd: int, dx: int, dgamma: int,
                     params: dict[str, Any], stream: Stream | None = None) -> CallRecord:
        """dx and dgamma of :meth:`rms_norm_fwd` from the saved rstd."""
        return self._norm_bwd("rms_norm_bwd", "rms", {"dy": dy, "x": x, "gamma": gamma, "rstd": rstd,
                                                      "dx": dx, "dgamma": dgamma}, params, stream)

    def softmax_fwd(self, x: int, y: int, params: dict[str, Any],
                    stream: Stream | None = None) -> CallRecord:
        """Softmax over the last axis (``params["log"]``: log-softmax); rows, cols, dtype."""
        dtype, rows, cols = self._rows("softmax_fwd", params)
        log = bool(params.get("log", False))
        return self._row_call("softmax_fwd", f"{'log' if log else ''}softmax_fwd", dtype, rows, cols,
                              lambda name: cg.softmax_kernel(name, dtype, cols, False, log, self.group_size),
                              {"x": x, "y": y}, stream,
                              f"one row per work-group, max-subtracted{' log' if log else ''} softmax")

    def softmax_bwd(self, y: int, dy: int, dx: int, params: dict[str, Any],
                    stream: Stream | None = None) -> CallRecord:
        """dx of :meth:`softmax_fwd` from its output y and dy (``params["log"]`` as there)."""
        dtype, rows, cols = self._rows("softmax_bwd", params)
        log = bool(params.get("log", False))
        return self._row_call("softmax_bwd", f"{'log' if log else ''}softmax_bwd", dtype, rows, cols,
                              lambda name: cg.softmax_kernel(name, dtype, cols, True, log, self.group_size),
                              {"y": y, "dy": dy, "dx": dx}, stream, "one row per work-group")

    # -- pooling -------------------------------------------------------------------------------------
    def _pool_setup(self, routine: str, params: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
        dtype = self._dnn_dtype(routine, params)
        mode = params.get("mode", "max")
        if mode not in ("max", "avg"):
            raise self._error(f"{routine}: mode must be 'max' or 'avg', got {mode!r}")
        p = dict(params)
        for key, default in (("kernel", None), ("stride", None), ("padding", 0)):
            v = p.get(key, default if key != "stride" else p.get("kernel"))
            if v is None:
                raise self._error(f"{routine}: missing {key!r}")
            p[key] = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
        self._positive(routine, n=p.get("n"), c=p.get("c"), h=p.get("h"), w=p.get("w"),
                       kernel_h=p["kernel"][0], kernel_w=p["kernel"][1],
                       stride_h=p["stride"][0], stride_w=p["stride"][1])
        if any(2 * pad > k for pad, k in zip(p["padding"], p["kernel"])) or min(p["padding"]) < 0:
            raise self._error(f"{routine}: padding {p['padding']} must be between 0 and half the "
                              f"window {p['kernel']}")
        g = cg.pool_geometry(p)
        if g["p_out"] <= 0 or g["q_out"] <= 0:
            raise self._error(f"{routine}: the {p['kernel']} window does not fit the padded input")
        return dtype, mode, g

    def pool2d_fwd(self, x: int, y: int, params: dict[str, Any], indices: int | None = None,
                   stream: Stream | None = None) -> CallRecord:
        """2-D max or average pooling over NCHW (``params``: n, c, h, w, kernel, stride
        (default: kernel), padding, mode "max"/"avg", dtype).  Average pooling counts padding
        in the divisor; max pooling writes the argmax (h*W + w, int64) to ``indices``."""
        dtype, mode, g = self._pool_setup("pool2d_fwd", params)
        if mode == "max" and indices is None:
            raise self._error("pool2d_fwd: max pooling needs an indices buffer (int64, one per output)")
        name = f"{self.name}_pool_{mode}_fwd_{dtype}_{_tag(g)}"
        module, image = self._dnn_module(("pool", name), lambda: [
            cg.pool2d_fwd_kernel(name, mode, dtype, g, POOL_BLOCK, self.group_size)[0]])
        total = g["n"] * g["c"] * g["p_out"] * g["q_out"]
        args = {"x": x, "y": y} | ({"indices": indices} if mode == "max" else {})
        self.runtime.launch(module, name, (math.ceil(total / POOL_BLOCK), 1, 1), args, stream)
        return self._record("pool2d_fwd", self.dnn["pool_algorithm"],
                            f"{mode} pooling, one lane per output, {g['r']}x{g['s']} window loop",
                            image, (g["n"], g["c"], g["h"], g["w"]))

    def pool2d_bwd(self, dy: int, dx: int, params: dict[str, Any], indices: int | None = None,
                   stream: Stream | None = None) -> CallRecord:
        """dx of :meth:`pool2d_fwd` (max: through the saved ``indices``); params as there."""
        dtype, mode, g = self._pool_setup("pool2d_bwd", params)
        if mode == "max" and indices is None:
            raise self._error("pool2d_bwd: max pooling needs the forward's indices buffer")
        name = f"{self.name}_pool_{mode}_bwd_{dtype}_{_tag(g)}"
        module, image = self._dnn_module(("pool", name), lambda: [
            cg.pool2d_bwd_kernel(name, mode, dtype, g, POOL_BLOCK, self.group_size)[0]])
        total = g["n"] * g["c"] * g["h"] * g["w"]
        args = {"dy": dy, "dx": dx} | ({"indices": indices} if mode == "max" else {})
        self.runtime.launch(module, name, (math.ceil(total / POOL_BLOCK), 1, 1), args, stream)
        return self._record("pool2d_bwd", self.dnn["pool_algorithm"],
                            f"{mode} pooling backward in pull form (one lane per input element, "
                            "no atomics)", image, (g["n"], g["c"], g["h"], g["w"]))
