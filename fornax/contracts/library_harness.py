"""The library suite's harness: operands, device transfers, float64 references and tolerances.

What the clauses of :mod:`fornax.contracts.library` run on: random operands, copies to and
from the device, the library's routines looked up as the protocol names them, the float64
reference of every routine the suite checks (GEMM with its options, convolution, attention,
the row routines and their backwards, pooling) and the tolerance each is held to.  The
tolerances are explained in :mod:`fornax.contracts.library`'s docstring.
"""

from __future__ import annotations


from typing import Any

import numpy as np

from ..layers import library as library_layer
from ..layers.errors import FornaxError, LibraryError
from .base import ContractFailure, Subject

#: per-output-dtype relative tolerance (one rounding of the result); see the module docstring
RTOL = {"float64": 1e-12, "float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3,
        "float8_e4m3fn": 1.25e-1, "float8_e5m2": 2.5e-1}
#: float32 accumulation: worst-case error per accumulated product, relative to |a||b|
ACC = 2.0 * 2.0 ** -24


# -- helpers -----------------------------------------------------------------------------------
def protocol_requires(routine: str) -> bool:
    """Whether the Library protocol (as it is when the clause runs) names ``routine``."""
    proto = library_layer.Library
    names = getattr(proto, "__protocol_attrs__", None)
    return routine in names if names is not None else hasattr(proto, routine)


def routine_of(lib, routine: str):
    """The bound routine, or a failure naming it as the hook that is missing."""
    fn = getattr(lib, routine, None)
    if not callable(fn):
        raise ContractFailure(f"not implemented: library.{routine} (the Library protocol requires it)")
    return fn


def open_library(s: Subject):
    """(runtime, library) of the family on the subject's devices."""
    rt = s.runtime()
    return rt, s.vendor.library(rt)


def np_dtype(name: str) -> np.dtype:
    from ..sim.isa import np_dtype as isa_np_dtype
    return isa_np_dtype(name)


def to_device(rt, host: np.ndarray) -> int:
    ptr = rt.malloc(max(host.nbytes, 1))
    rt.memcpy_h2d(ptr, np.ascontiguousarray(host))
    return ptr


def from_device(rt, ptr: int, shape: tuple, dtype) -> np.ndarray:
    out = np.empty(shape, np_dtype(dtype) if isinstance(dtype, str) else dtype)
    rt.memcpy_d2h(out, ptr)
    return out


def random_operand(rng: np.random.Generator, shape: tuple, dtype: str) -> np.ndarray:
    """Standard-normal values rounded to ``dtype`` (the reference uses the rounded values)."""
    return rng.standard_normal(shape).astype(np.float32).astype(np_dtype(dtype))


def gemm_bound(a64: np.ndarray, b64: np.ndarray, ref: np.ndarray, k: int, dtype: str) -> np.ndarray:
    """The per-element error bound of the module docstring."""
    return RTOL[dtype] * np.abs(ref) + ACC * k * (np.abs(a64) @ np.abs(b64)) + 1e-30


def check_close(what: str, out: np.ndarray, ref: np.ndarray, bound: np.ndarray) -> None:
    out64 = np.asarray(out, np.float64)
    if out64.shape != ref.shape:
        raise ContractFailure(f"{what}: result has shape {out64.shape}, expected {ref.shape}")
    if not np.all(np.isfinite(out64)):
        raise ContractFailure(f"{what}: the result holds non-finite values")
    err = np.abs(out64 - ref)
    bad = err > bound
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ContractFailure(f"{what}: {int(bad.sum())} of {bad.size} elements outside tolerance; "
                              f"at {idx} got {out64[idx]:.6g}, float64 reference {ref[idx]:.6g} "
                              f"(bound {bound[idx]:.3g})")


def expect_library_error(fn, what: str) -> LibraryError:
    try:
        fn()
    except LibraryError as exc:
        return exc
    except FornaxError as exc:
        raise ContractFailure(f"{what}: raised {type(exc).__name__} ({exc}), expected a LibraryError") from None
    raise ContractFailure(f"{what}: no error was raised")


def run_gemm(rt, lib, rng, m: int, n: int, k: int, batch: int, b_batched: bool, dtype: str):
    """One plain GEMM C = A @ B on the device: (record, out, ref, bound)."""
    a = random_operand(rng, (batch, m, k), dtype)
    b = random_operand(rng, (batch if b_batched else 1, k, n), dtype)
    pa, pb = to_device(rt, a), to_device(rt, b)
    pc = rt.malloc(batch * m * n * np_dtype(dtype).itemsize)
    params = {"m": m, "n": n, "k": k, "batch": batch, "b_batched": b_batched, "dtype": dtype}
    record = routine_of(lib, "gemm")(pa, pb, pc, params)
    out = from_device(rt, pc, (batch, m, n), dtype)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64 @ b64
    return record, out, ref, gemm_bound(a64, b64, ref, k, dtype)


def gemm_sweep(s: Subject, dtype: str, seed: int, cases: int, kmax: int) -> None:
    rt, lib = open_library(s)
    rng = np.random.default_rng(seed)
    shapes = [(1, 1, 1, 1, False), (33, 17, kmax, 1, False)]       # degenerate, and a long reduction
    while len(shapes) < cases:
        shapes.append((int(rng.integers(1, 97)), int(rng.integers(1, 97)), int(rng.integers(1, kmax + 1)),
                       int(rng.integers(1, 4)), bool(rng.integers(0, 2))))
    for m, n, k, batch, b_batched in shapes:
        _, out, ref, bound = run_gemm(rt, lib, rng, m, n, k, batch, b_batched, dtype)
        check_close(f"{dtype} gemm m={m} n={n} k={k} batch={batch} b_batched={b_batched}", out, ref, bound)


#: row routines (softmax, norms): |out - ref| <= ROW_RTOL[dtype] * (|ref| + max |ref| of the row)
ROW_RTOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
ROW_ROUTINES = ("softmax_fwd", "softmax_bwd", "layer_norm_fwd", "rms_norm_fwd")


def row_bound(ref: np.ndarray, dtype: str) -> np.ndarray:
    return ROW_RTOL[dtype] * (np.abs(ref) + np.abs(ref).max(axis=-1, keepdims=True)) + 1e-30


# -- GEMM options (L10) ------------------------------------------------------------------------
FP8 = ("float8_e4m3fn", "float8_e5m2")
#: the slope of relu, gelu (tanh form) and silu is below this everywhere: an error of the
#: pre-activation value moves the result by at most this factor
ACT_SLOPE = 1.2


def np_act(x: np.ndarray, act: str) -> np.ndarray:
    """The epilogue activations in float64 (gelu: the tanh approximation)."""
    if act == "relu":
        return np.maximum(x, 0.0)
    if act == "gelu":
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))
    if act == "silu":
        return x / (1.0 + np.exp(-x))
    return x


def gemm_listed_dtypes(s: Subject, lib) -> set:
    """The GEMM dtypes the family declares (its ``[library] gemm_dtypes``), else the library's."""
    listed = (s.vendor.facts or {}).get("library", {}).get("gemm_dtypes")
    if listed is None:
        listed = getattr(lib, "dtypes", ())
    return set(listed)


def run_gemm_opts(rt, lib, rng, m: int, n: int, k: int, dtype: str = "float32", batch: int = 1,
                  trans_a: bool = False, trans_b: bool = False, pad: int = 0, alpha: float = 1.0,
                  beta: float = 0.0, bias: bool = False, act: str = "none", out: str | None = None,
                  scales: tuple[float, float] = (1.0, 1.0), extra: dict | None = None):
    """One GEMM with options; returns (record, out, ref, bound, label).

    ``pad`` elements of slack between batches (strided batch); the operands are stored as the
    options say (A: k x m when transposed, B: n x k) and the reference reads them the same way.
    """
    out = out or ("bfloat16" if dtype in FP8 else dtype)
    a_shape, b_shape = ((k, m) if trans_a else (m, k)), ((n, k) if trans_b else (k, n))
    sa, sb, sc = m * k + pad, k * n + pad, m * n + pad
    a = random_operand(rng, (batch, sa), dtype)
    b = random_operand(rng, (batch, sb), dtype)
    c0 = random_operand(rng, (batch, sc), out)
    a64 = a.astype(np.float64)[:, :m * k].reshape(batch, *a_shape)
    b64 = b.astype(np.float64)[:, :k * n].reshape(batch, *b_shape)
    opa = np.swapaxes(a64, 1, 2) if trans_a else a64
    opb = np.swapaxes(b64, 1, 2) if trans_b else b64
    scale = scales[0] * scales[1]
    prod = alpha * scale * (opa @ opb)
    pre = prod + beta * c0.astype(np.float64)[:, :m * n].reshape(batch, m, n)
    params = {"m": m, "n": n, "k": k, "batch": batch, "dtype": dtype, "trans_a": trans_a,
              "trans_b": trans_b, "stride_a": sa, "stride_b": sb, "stride_c": sc, "alpha": alpha,
              "beta": beta, "activation": act, **(extra or {})}
    if out != params["dtype"] or dtype in FP8:
        params["out_dtype"] = out
    if dtype in FP8:
        params["a_scale"], params["b_scale"] = scales
    bias_v = np.zeros(n)
    if bias:
        bias_h = random_operand(rng, (n,), out)
        bias_v = bias_h.astype(np.float64)
        params["bias"] = to_device(rt, bias_h)
    pre = pre + bias_v
    ref = np_act(pre, act)
    pa, pb, pc = to_device(rt, a), to_device(rt, b), to_device(rt, c0)
    record = routine_of(lib, "gemm")(pa, pb, pc, params)
    got = from_device(rt, pc, (batch, sc), out)
    # batches' slack between outputs must be left alone
    if pad and not np.array_equal(got[:, m * n:].view(np.uint8), c0[:, m * n:].view(np.uint8)):
        raise ContractFailure(f"gemm {dtype} m={m} n={n} k={k} batch={batch} stride_c={sc}: the "
                              f"{pad} elements between the batches' outputs were overwritten")
    got = got[:, :m * n].reshape(batch, m, n)
    mag = np.abs(alpha * scale) * (np.abs(opa) @ np.abs(opb))
    epi = np.abs(prod) + np.abs(beta * c0.astype(np.float64)[:, :m * n].reshape(batch, m, n)) \
        + np.abs(bias_v)
    # one rounding of every epilogue term in float32, float32 accumulation, one output rounding
    pre_bound = ACC * k * mag + 4 * RTOL["float32"] * epi
    bound = RTOL[out] * np.abs(ref) + (ACT_SLOPE if act != "none" else 1.0) * pre_bound + 1e-30
    if act in ("gelu", "silu"):                    # the activation itself, evaluated in float32
        bound = bound + 8 * RTOL["float32"] * (np.abs(pre) + 1.0)
    label = (f"{dtype} gemm m={m} n={n} k={k} batch={batch} trans={'T' if trans_a else 'N'}"
             f"{'T' if trans_b else 'N'} stride pad={pad} alpha={alpha:g} beta={beta:g} "
             f"bias={bias} activation={act} out={out}")
    return record, got, ref, bound, label


# -- convolution (L11) -------------------------------------------------------------------------
def _conv_windows(xp: np.ndarray, r: int, s: int, g: dict):
    """The (n, c, P, Q) slice of the padded input that filter tap (r, s) reads."""
    (sh, sw), (dh, dw) = g["stride"], g["dilation"]
    P, Q = g["P"], g["Q"]
    return (slice(None), slice(None), slice(r * dh, r * dh + sh * (P - 1) + 1, sh),
            slice(s * dw, s * dw + sw * (Q - 1) + 1, sw))


def conv_reference(pass_: str, a: np.ndarray, b: np.ndarray, g: dict) -> np.ndarray:
    """Direct float64 convolution over filter taps and groups.

    fwd: a = x [n, c, h, w], b = w [k, c/groups, r, s] -> y [n, k, P, Q];
    bwd_data: a = dy, b = w -> dx [n, c, h, w]; bwd_weights: a = x, b = dy -> dw."""
    n, c, h, w, k, R, S, G = (g[key] for key in ("n", "c", "h", "w", "k", "r", "s", "groups"))
    (ph, pw), P, Q = g["padding"], g["P"], g["Q"]
    cg, kg = c // G, k // G
    if pass_ == "fwd":
        xp = np.pad(a, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        y = np.zeros((n, k, P, Q))
        for r in range(R):
            for s in range(S):
                win = xp[_conv_windows(xp, r, s, g)]
                for grp in range(G):
                    cs, ks = slice(grp * cg, (grp + 1) * cg), slice(grp * kg, (grp + 1) * kg)
                    y[:, ks] += np.einsum("ncpq,kc->nkpq", win[:, cs], b[ks, :, r, s])
        return y
    if pass_ == "bwd_data":
        dxp = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
        for r in range(R):
            for s in range(S):
                sl = _conv_windows(dxp, r, s, g)
                for grp in range(G):
                    cs, ks = slice(grp * cg, (grp + 1) * cg), slice(grp * kg, (grp + 1) * kg)
                    dxp[(sl[0], cs, sl[2], sl[3])] += np.einsum("nkpq,kc->ncpq", a[:, ks], b[ks, :, r, s])
        return dxp[:, :, ph:ph + h, pw:pw + w]
    xp = np.pad(a, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    dw = np.zeros((k, cg, R, S))
    for r in range(R):
        for s in range(S):
            win = xp[_conv_windows(xp, r, s, g)]
            for grp in range(G):
                cs, ks = slice(grp * cg, (grp + 1) * cg), slice(grp * kg, (grp + 1) * kg)
                dw[ks, :, r, s] = np.einsum("ncpq,nkpq->kc", win[:, cs], b[:, ks])
    return dw


def conv_cases(seed: int, count: int) -> list[dict[str, Any]]:
    """Small seeded convolution problems whose filter fits the padded input."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    while len(out) < count:
        G = int(rng.integers(1, 3))
        p: dict[str, Any] = dict(n=int(rng.integers(1, 3)), c=G * int(rng.integers(1, 4)), k=G * int(rng.integers(1, 4)),
                 h=int(rng.integers(4, 9)), w=int(rng.integers(4, 9)), r=int(rng.integers(1, 4)),
                 s=int(rng.integers(1, 4)), groups=G,
                 stride=(int(rng.integers(1, 3)), int(rng.integers(1, 3))),
                 padding=(int(rng.integers(0, 2)), int(rng.integers(0, 2))),
                 dilation=(int(rng.integers(1, 3)), int(rng.integers(1, 3))))
        P = (p["h"] + 2 * p["padding"][0] - p["dilation"][0] * (p["r"] - 1) - 1) // p["stride"][0] + 1
        Q = (p["w"] + 2 * p["padding"][1] - p["dilation"][1] * (p["s"] - 1) - 1) // p["stride"][1] + 1
        if P >= 1 and Q >= 1:
            out.append({**p, "P": P, "Q": Q})
    return out


# -- attention and the row backwards (L12) -----------------------------------------------------
#: attention: |out - ref| <= ATT_RTOL[dtype] * (|ref| + max |ref| of the tensor).  float32
#: accumulation and one rounding of each stored result, plus (low precision) the rounding of
#: the probabilities to the storage dtype before the second product, as flash kernels do
ATT_RTOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}


def attention_reference(q, k, v, do, scale: float, causal: bool):
    """Softmax attention and its analytic backward in float64: (o, lse, dq, dk, dv)."""
    sq, sk = q.shape[-2], k.shape[-2]
    scores = scale * (q @ np.swapaxes(k, -1, -2))
    if causal:                                   # key j visible to query i when j <= i
        scores = np.where(np.tril(np.ones((sq, sk), bool)), scores, -np.inf)
    mx = scores.max(-1, keepdims=True)
    e = np.exp(scores - mx)
    lse = (mx + np.log(e.sum(-1, keepdims=True)))[..., 0]
    p = e / e.sum(-1, keepdims=True)
    o = p @ v
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (do * o).sum(-1, keepdims=True))
    dq = scale * (ds @ k)
    dk = scale * (np.swapaxes(ds, -1, -2) @ q)
    return o, lse, dq, dk, dv


def tensor_bound(ref: np.ndarray, rtol: float) -> np.ndarray:
    return rtol * (np.abs(ref) + np.abs(ref).max()) + 1e-30


def norm_bwd_reference(kind: str, x, gamma, dy):
    """Layer norm (``kind`` layer) or RMS norm backward in float64: (dx, dgamma, dbeta, scale)
    where ``scale`` is each row's natural size of dx, ``|dy * gamma| * rstd``."""
    cols = x.shape[1]
    mean = x.mean(axis=1, keepdims=True) if kind == "layer" else 0.0
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + 1e-5)
    xhat = (x - mean) * rstd
    g = dy * gamma
    dx = g - xhat * (g * xhat).sum(axis=1, keepdims=True) / cols
    if kind == "layer":
        dx = dx - g.sum(axis=1, keepdims=True) / cols
    dx = dx * rstd
    natural = (np.abs(g) * rstd).max(axis=1, keepdims=True)
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0), natural, np.abs(dy * xhat).sum(axis=0)


# -- pooling (L13) -----------------------------------------------------------------------------
def pool_reference(x: np.ndarray, dy: np.ndarray | None, mode: str, kernel, stride, padding):
    """Max or average 2-D pooling of NCHW ``x`` in float64 (average counts the padding in the
    divisor; max never picks padding): (y, argmax as h*W + w, dx for ``dy``)."""
    n, c, H, W = x.shape
    (R, S), (sh, sw), (ph, pw) = kernel, stride, padding
    P, Q = (H + 2 * ph - R) // sh + 1, (W + 2 * pw - S) // sw + 1
    y, idx, dx = np.zeros((n, c, P, Q)), np.zeros((n, c, P, Q), np.int64), np.zeros(x.shape)
    for i in range(P):
        for j in range(Q):
            h0, w0 = i * sh - ph, j * sw - pw
            hs, ws = slice(max(h0, 0), min(h0 + R, H)), slice(max(w0, 0), min(w0 + S, W))
            win = x[:, :, hs, ws]
            if mode == "avg":
                y[:, :, i, j] = win.sum(axis=(2, 3)) / (R * S)
                if dy is not None:
                    dx[:, :, hs, ws] += dy[:, :, i, j][:, :, None, None] / (R * S)
                continue
            flat = win.reshape(n, c, -1)
            arg = flat.argmax(axis=2)
            y[:, :, i, j] = flat.max(axis=2)
            wh = win.shape[3]
            hh, ww = hs.start + arg // wh, ws.start + arg % wh
            idx[:, :, i, j] = hh * W + ww
            if dy is not None:
                for a in range(n):
                    for b in range(c):
                        dx[a, b, hh[a, b], ww[a, b]] += dy[a, b, i, j]
    return y, idx, dx


# -- collectives (L14) -------------------------------------------------------------------------
#: wall-clock seconds a watchdog diagnosis may take before the clause calls it a hang
HANG_S = 30.0
#: the simulated watchdog timeout the clause gives its communicator
WATCHDOG_S = 0.25


def host_wait(fn, what: str):
    """Run ``fn`` (a host wait) on a helper thread; a wait that never returns fails the clause
    instead of hanging the suite.  Returns the exception ``fn`` raised, or None."""
    import threading
    box: list = []

    def run():
        try:
            fn()
            box.append(None)
        except BaseException as exc:           # handed back to the clause
            box.append(exc)
    t = threading.Thread(target=run, name="fornax-conform-wait", daemon=True)
    t.start()
    t.join(HANG_S)
    if t.is_alive():
        raise ContractFailure(f"{what}: the host wait did not return within {HANG_S:g} s of wall "
                              "time (a hang; expected the watchdog's diagnosis)")
    return box[0]



def upload_ranks(comm, arrays) -> list[int]:
    """One device buffer per rank holding ``arrays[rank]`` (at least 4 bytes), uploaded."""
    ptrs = []
    for r, a in enumerate(arrays):
        p = comm.malloc(r, max(a.nbytes, 4))
        comm.upload(r, p, a)
        ptrs.append(p)
    return ptrs
