"""PyTorch's own OpInfo samples on the ``fornax`` device, compared with CPU eager.

For each OpInfo of :data:`TOP_OPS` (names from ``op_db`` of
``torch.testing._internal.common_methods_invocations``) :func:`run_opinfo` takes its
``sample_inputs("cpu", dtype)``, runs ``op(sample.input, *sample.args, **sample.kwargs)``
on the CPU and on fornax copies of every tensor of the sample, and compares the results
with ``torch.testing.assert_close`` (``equal_nan=True``; dtypes must match; results must
be on ``fornax``; PyTorch's default tolerances unless the OpInfo declares looser ones, see
:func:`tolerances`).  Both runs start from the same RNG seed, so ops that draw random
numbers (dropout: the device draws them from the host generator) are comparable.  A sample
with no tensor and no device argument (``arange(3)``) never touches the device and is
skipped, not counted.

A sample that raises on the CPU passes when fornax raises the same exception type (error
parity).  The routes a sample's ATen ops took come from the session's route counter
(``session.stats.routes``, the delta over the fornax run); an op is *claimed native by the
framework seam* when no ATen op of any of its samples fell back to the CPU (every one ran
as a device kernel, a view, a runtime copy or a decomposition into those).

Honest limits: ``op_db`` lives in PyTorch's test package, which imports ``expecttest`` (in
fornax's ``test`` extra).  A sample runs in
this process; a Python exception on either side is caught and counted, a crash of the
interpreter itself (a segfault in a C++ kernel) could not be.
"""

from __future__ import annotations

import sys
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ...layers.errors import ConfigError

DEVICE = "fornax"

# The 150 OpInfos real models use most, chosen from the ops the forward, backward and optimizer
# steps of torchvision CNNs, Hugging Face transformers and nanoGPT-style LMs (SGD/AdamW) call.
TOP_OPS: tuple[str, ...] = (
    # elementwise arithmetic and math
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "rsub", "__rsub__", "__rdiv__",
    "neg", "abs", "reciprocal", "pow", "square", "sqrt", "rsqrt", "exp", "expm1", "log", "log2",
    "log1p", "sin", "cos", "tanh", "sigmoid", "erf", "atan2", "floor", "ceil", "round", "trunc",
    "sign", "remainder", "maximum", "minimum", "clamp", "clamp_min", "lerp", "addcmul", "addcdiv",
    "nan_to_num",
    # comparisons and logic
    "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "logical_not", "logical_and", "logical_or",
    "where", "masked_fill",
    # reductions and scans
    "sum", "mean", "prod", "amax", "amin", "max.reduction_no_dim", "max.reduction_with_dim",
    "max.binary", "min.reduction_no_dim", "min.reduction_with_dim", "argmax", "argmin", "var", "std",
    "var_mean", "logsumexp", "cumsum", "all", "any", "topk", "sort", "linalg.vector_norm",
    # matrix products
    "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum",
    # nn.functional layers, activations and losses
    "nn.functional.linear", "nn.functional.conv1d", "nn.functional.conv2d",
    "nn.functional.conv_transpose2d", "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu",
    "nn.functional.leaky_relu", "nn.functional.hardtanh", "nn.functional.hardswish", "softmax",
    "log_softmax", "nn.functional.layer_norm", "nn.functional.batch_norm", "nn.functional.group_norm",
    "nn.functional.rms_norm", "nn.functional.dropout", "nn.functional.embedding",
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
    "nn.functional.l1_loss", "nn.functional.smooth_l1_loss",
    "nn.functional.binary_cross_entropy_with_logits", "nn.functional.max_pool2d",
    "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d", "nn.functional.pad.constant",
    "nn.functional.interpolate.nearest", "nn.functional.interpolate.bilinear",
    "nn.functional.scaled_dot_product_attention", "nn.functional.normalize",
    # views, shapes and indexing
    "view", "reshape", "permute", "transpose", "t", "unsqueeze", "squeeze", "flatten", "expand",
    "clone", "narrow", "select", "unbind", "split", "chunk", "cat", "stack", "index_select", "gather",
    "scatter", "scatter_add", "index_put", "index_add", "__getitem__", "tril", "triu", "flip", "roll",
    "repeat",
    # creation and conversion
    "zeros_like", "ones_like", "full_like", "arange", "zeros", "ones", "full", "to",
)

#: routes that keep an op on the device (anything but ``fallback``)
DEVICE_ROUTES = frozenset({"native", "view", "decomposed", "runtime"})


@dataclass
class OpResult:
    """What the samples of one OpInfo did on fornax."""

    name: str
    run: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0                                     # samples with nothing on fornax
    first_error: str = ""
    routes: Counter = field(default_factory=Counter)     # (aten op, route) -> calls
    reasons: dict = field(default_factory=dict)          # aten op -> why it fell back

    @property
    def why_not_native(self) -> str:
        """The first fallback reason that is not "through <functional op>" (an out= or
        in-place twin's), else the first one."""
        whys = [w for w in self.reasons.values() if w]
        return next((w for w in whys if not w.startswith("through ")), whys[0] if whys else "")

    @property
    def native(self) -> bool:
        """Claimed native by the framework seam: no ATen op fell back to the CPU."""
        return self.run > 0 and all(kind in DEVICE_ROUTES for _, kind in self.routes)

    @property
    def fallbacks(self) -> list[str]:
        return sorted({op for op, kind in self.routes if kind == "fallback"})


@dataclass
class Summary:
    """Pass rates of a run of :func:`run_opinfo`."""

    results: list[OpResult]

    @property
    def run(self) -> int:
        return sum(r.run for r in self.results)

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def rate(self) -> float:
        return self.passed / self.run if self.run else 0.0

    @property
    def native(self) -> list[OpResult]:
        return [r for r in self.results if r.native]

    @property
    def native_rate(self) -> float:
        run = sum(r.run for r in self.native)
        return sum(r.passed for r in self.native) / run if run else 0.0

    def failing(self) -> list[OpResult]:
        """Ops with a failed sample, most failures first."""
        return sorted((r for r in self.results if r.failed), key=lambda r: (-r.failed, r.name))


# ---------------------------------------------------------------------------------------------
# op_db
_OP_DB: dict | None = None


def op_db() -> dict:
    """``{OpInfo full name: OpInfo}`` of PyTorch's ``op_db`` (imported once; several seconds)."""
    global _OP_DB
    if _OP_DB is None:
        try:
            import expecttest  # noqa: F401
        except ImportError:
            raise ConfigError("PyTorch's OpInfo database needs the expecttest package",
                              hint="install fornax's test extra: pip install -e '.[test]'") from None
        frozen = torch.backends.flags_frozen()
        from torch.testing._internal.common_methods_invocations import op_db as db
        if not frozen:          # PyTorch's test utilities freeze torch.backends flags on import
            torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
        _OP_DB = {full_name(o): o for o in db}
    return _OP_DB


def sample(input, *args, **kwargs):
    """An OpInfo ``SampleInput`` of ``op(input, *args, **kwargs)`` (for checking one call)."""
    op_db()
    from torch.testing._internal.opinfo.core import SampleInput
    return SampleInput(input, args=args, kwargs=kwargs)


def full_name(opinfo) -> str:
    """``name`` or ``name.variant`` (how op_db's tests name an OpInfo)."""
    return f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name


def tolerances(opinfo, dtype: torch.dtype) -> dict:
    """``assert_close`` keyword arguments: the loosest ``dtype`` tolerance the OpInfo declares
    for PyTorch's value-comparing op tests (``TestCommon``: device vs CPU, non-contiguous
    samples, out=, variant consistency) on the CPU or an accelerator, else PyTorch's defaults."""
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
    atol = rtol = None
    for info in opinfo.decorators or ():
        if not hasattr(info, "decorators") or not info.active_if:
            continue
        if info.cls_name not in (None, "TestCommon") or info.device_type not in (None, "cpu", "cuda") \
                or (info.dtypes is not None and dtype not in info.dtypes):
            continue
        for d in info.decorators:
            if isinstance(d, toleranceOverride) and dtype in d.d:
                atol = max(atol or 0.0, d.d[dtype].atol)
                rtol = max(rtol or 0.0, d.d[dtype].rtol)
            elif isinstance(d, precisionOverride) and dtype in d.d:
                atol = max(atol or 0.0, d.d[dtype])
    if atol is None and rtol is None:
        return {}
    from torch.testing._comparison import default_tolerances
    drtol, datol = default_tolerances(dtype)
    return {"atol": max(atol or 0.0, datol), "rtol": max(rtol or 0.0, drtol)}


# ---------------------------------------------------------------------------------------------
# running samples
def _to_fornax(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to(DEVICE).requires_grad_(x.requires_grad)
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device(DEVICE)
    if isinstance(x, str) and x == "cpu":
        return DEVICE
    return x


def _to_cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _call(opinfo, sample, seed: int):
    torch.manual_seed(seed)
    out = opinfo(sample.input, *sample.args, **sample.kwargs)
    return sample.output_process_fn_grad(out)


def _short(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0][:300] if msg else ''}"


def run_sample(opinfo, sample, seed: int = 0, dtype: torch.dtype | None = None
               ) -> tuple[bool | None, str, Counter]:
    """Run one sample on the CPU and on fornax: (passed, why not, routes of the fornax run);
    passed is None for a sample with no tensor or device argument (nothing runs on fornax)."""
    from torch.testing._internal.opinfo.core import SampleInput

    if not any(isinstance(x, torch.Tensor) or _to_fornax(x) is not x
               for x in tree_flatten((sample.input, sample.args, sample.kwargs))[0]):
        return None, "no tensor or device argument: CPU against CPU", Counter()
    try:
        want = _call(opinfo, sample, seed)
        cpu_error = None
    except Exception as exc:           # error parity: fornax must raise the same type
        want, cpu_error = None, exc
    try:
        with torch.no_grad():
            inp, args, kwargs = tree_map(_to_fornax, (sample.input, sample.args, sample.kwargs))
        dev = SampleInput(inp, args=args, kwargs=kwargs, output_process_fn_grad=sample.output_process_fn_grad)
    except Exception as exc:
        return False, f"moving the sample to fornax: {_short(exc)}", Counter()
    stats = _session_stats()
    before = Counter(stats.routes)
    try:
        got = _call(opinfo, dev, seed)
        got_cpu = tree_map(_to_cpu, got)
        error = None
    except Exception as exc:
        got = got_cpu = None
        error = exc
    routes = Counter(stats.routes)
    routes.subtract(before)
    routes = +routes
    if cpu_error is not None:
        if error is not None and type(error) is type(cpu_error):
            return True, "", routes
        what = "no error" if error is None else _short(error)
        return False, f"CPU raised {_short(cpu_error)}; fornax: {what}", routes
    if error is not None:
        tb = traceback.extract_tb(error.__traceback__)
        where = next((f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in reversed(tb)
                      if "fornax" in f.filename), "")
        return False, f"{_short(error)}{' (' + where + ')' if where else ''}", routes
    wrong = [t.device for t, w in zip(tree_flatten(got)[0], tree_flatten(want)[0])
             if isinstance(t, torch.Tensor) and isinstance(w, torch.Tensor)
             and w.device.type == "cpu" and t.device.type != DEVICE]
    if wrong:
        return False, f"a result is on {wrong[0]}, not on {DEVICE}", routes
    try:
        torch.testing.assert_close(got_cpu, want, equal_nan=True, **tolerances(opinfo, dtype or _dtype(sample)))
    except Exception as exc:
        return False, " ".join(str(exc).split())[:400], routes
    return True, "", routes


def _dtype(sample) -> torch.dtype:
    first = next((t for t in tree_flatten((sample.input, sample.args, sample.kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
    return first.dtype if first is not None else torch.float32


def _session_stats():
    import fornax.frameworks.torch as ft
    return ft.current().stats


def run_op(opinfo, dtype: torch.dtype = torch.float32, max_samples: int | None = None) -> OpResult:
    """Every ``sample_inputs("cpu", dtype)`` of one OpInfo (or the first ``max_samples`` that
    run on fornax)."""
    res = OpResult(full_name(opinfo))
    if dtype not in opinfo.supported_dtypes("cpu"):
        return res
    try:
        samples = iter(opinfo.sample_inputs("cpu", dtype))
    except Exception as exc:
        res.first_error = f"sample_inputs: {_short(exc)}"
        return res
    limit = max_samples if max_samples is not None else sys.maxsize
    i = -1
    while res.run < limit:
        i += 1
        try:
            sample = next(samples)
        except StopIteration:
            break
        except Exception as exc:
            res.first_error = res.first_error or f"sample_inputs: {_short(exc)}"
            break
        ok, why, routes = run_sample(opinfo, sample, seed=i, dtype=dtype)
        if ok is None:
            res.skipped += 1
            continue
        res.run += 1
        res.routes.update(routes)
        for op, kind in routes:
            if kind == "fallback" and op not in res.reasons:
                res.reasons[op] = _session_stats().reasons.get((op, kind), "")
        if ok:
            res.passed += 1
        else:
            res.failed += 1
            res.first_error = res.first_error or f"sample {i}: {why}"
    return res


def run_opinfo(ops=None, dtype: torch.dtype = torch.float32, max_samples: int | None = None) -> Summary:
    """Run the samples of ``ops`` (OpInfo names; default :data:`TOP_OPS`) on the active
    fornax stack against CPU eager; one :class:`OpResult` per op, in order.  ``max_samples``
    caps the samples per op (the first ones ``sample_inputs`` yields); the global RNG state
    is restored afterwards."""
    import fornax.frameworks.torch  # noqa: F401  (registers the device)
    db = op_db()
    names = TOP_OPS if ops is None else tuple(ops)
    missing = [n for n in names if n not in db]
    if missing:
        raise ConfigError(f"not OpInfo names of PyTorch's op_db: {', '.join(missing)}", seam="framework",
                          hint="use op_db names as full_name() spells them, e.g. 'add', "
                               "'div.floor_rounding', 'nn.functional.conv2d'")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")            # op_db's deprecated overloads warn per sample
        return Summary([run_op(db[n], dtype, max_samples) for n in names])
