"""One OpInfo sample on fornax against the same sample on the CPU, per variant.

Samples are generated on the device (``op.sample_inputs("fornax", dtype)``, as PyTorch's
``test_ops.py`` does, so arguments PyTorch keeps on the CPU stay there) and copied to the
CPU for the reference.  Each function returns ``None`` when the sample does not apply to
the variant (nothing to compare, not counted), ``""`` when it passed, or why it failed.

* forward: ``op(sample)`` on both; results compared with ``torch.testing.assert_close``
  (``equal_nan``, dtypes and shapes must match, PyTorch's tolerances for the dtype unless
  the OpInfo declares looser ones), every CPU result must come back on fornax;
* noncontiguous: ``sample.noncontiguous()`` made on fornax against the same made on the CPU
  (so an op that refuses such strides, ``view_as_complex``, must refuse on both);
* out: the CPU result's shapes and dtypes allocated on fornax and passed as ``out=``;
  the out tensors must hold the CPU values and be what the op returns;
* inplace: ``op.get_inplace()`` on a fornax clone; the mutated input and the return value;
* backward (float32): a seeded cotangent per differentiable output, gradients of every
  input that requires grad.

Error parity: where the CPU raises, fornax must raise the same exception type.  Ops that
draw random numbers run from the same seed on both sides.

Where an OpInfo skips the ``TestCommon`` test behind a variant on every device (PyTorch's
own verdict that the property does not hold for the op: ``as_strided_scatter`` on
non-contiguous inputs, say), the variant is skipped with PyTorch's reason
(:func:`upstream_skip`) instead of being compared.
"""

from __future__ import annotations

import traceback
import zlib

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ...frameworks.torch.opinfo import tolerances
from . import harness
from .record import WITHIN

DEVICE = "fornax"

#: the covering known-failure entry's tolerance while the suite runs one check (a tolerance
#: entry, see :mod:`.known`), else None
TOLERANCE: dict | None = None


def short(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0][:240] if lines else ''}"
    where = next((f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
                  for f in reversed(traceback.extract_tb(exc.__traceback__)) if "/fornax/" in f.filename and "/torch_suite/" not in f.filename), "")
    return f"{text} ({where})" if where else text


def seed_of(name: str, i: int) -> int:
    return (zlib.crc32(name.encode()) + i) % (2 ** 31)


def _host_copy(x: torch.Tensor) -> torch.Tensor:
    """``x`` on the CPU with the same storage geometry: a view into a copy of its whole
    storage at the same sizes, strides and offset, so that what depends on the storage (the
    ``as_strided`` family, views of a larger base) sees on the CPU what it sees on fornax."""
    x = x.detach()
    if x.device.type != DEVICE or x.layout != torch.strided:
        return x.to("cpu")
    n = x.untyped_storage().nbytes() // x.element_size()
    if x.storage_offset() == 0 and n == x.numel() and x.is_contiguous():
        return x.to("cpu")
    whole = x.as_strided((n,), (1,), 0).to("cpu")
    return whole.as_strided(x.shape, x.stride(), x.storage_offset())


def _cpu_leaf(x):
    if isinstance(x, torch.Tensor):
        t = _host_copy(x)
        if x.requires_grad:
            t.requires_grad_(True)
        return t
    if isinstance(x, torch.device) and x.type == DEVICE:
        return torch.device("cpu")
    if isinstance(x, str) and x.split(":")[0] == DEVICE:
        return "cpu"
    return x


def to_cpu(sample):
    """The sample with every fornax tensor copied to the CPU (leaves keep requires_grad)."""
    from torch.testing._internal.opinfo.core import SampleInput
    with torch.no_grad():
        inp, args, kwargs = tree_map(_cpu_leaf, (sample.input, sample.args, sample.kwargs))
    return SampleInput(inp, args=args, kwargs=kwargs, output_process_fn_grad=sample.output_process_fn_grad,
                       broadcasts_input=sample.broadcasts_input)


def _host(x):
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


def _run(fn, seed):
    harness.seed(seed)
    try:
        return fn(), None
    except Exception as exc:        # compared for parity below
        return None, exc


def _parity(cpu_exc, dev_exc) -> str | None:
    """None when both succeeded; "" when both raised the same type; else why not."""
    if cpu_exc is None and dev_exc is None:
        return None
    if cpu_exc is not None and dev_exc is not None:
        return "" if type(dev_exc) is type(cpu_exc) else f"CPU raised {short(cpu_exc)}; fornax raised {short(dev_exc)}"
    if cpu_exc is not None:
        return f"CPU raised {short(cpu_exc)}; fornax raised nothing"
    return short(dev_exc)


#: ops whose results are uninitialised memory (op_db marks them "not comparable"): only their
#: shapes, dtypes, strides and device are compared
UNINITIALISED = frozenset({"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
                           "empty_permuted"})


def home(sample) -> str:
    """The device a sample's results belong on: the one its ``device=`` argument names, else
    fornax when any input is a fornax tensor, else the CPU (a factory given only numbers, or
    PyTorch's ``*_like`` samples that ask for ``device="cpu"`` on purpose)."""
    asked = sample.kwargs.get("device")
    if asked is not None:
        return torch.device(asked).type
    leaves = tree_flatten((sample.input, sample.args, sample.kwargs))[0]
    return DEVICE if any(isinstance(x, torch.Tensor) and x.device.type == DEVICE for x in leaves) else "cpu"


def same(got, want, op, dtype, where: str = DEVICE) -> str:
    """"" when ``got`` (fornax results) matches ``want`` (CPU results) and sits on ``where``,
    else why not."""
    g_flat, w_flat = tree_flatten(got)[0], tree_flatten(want)[0]
    for g, w in zip(g_flat, w_flat):
        if isinstance(w, torch.Tensor) and w.device.type == "cpu" and isinstance(g, torch.Tensor) \
                and g.device.type != where:
            return f"a result is on {g.device}, not on {where}"
    if op.name in UNINITIALISED:
        meta = (lambda t: (tuple(t.shape), t.dtype, t.stride()) if isinstance(t, torch.Tensor) else t)
        g_meta, w_meta = [meta(t) for t in g_flat], [meta(t) for t in w_flat]
        return "" if g_meta == w_meta else f"shape, dtype or strides differ: {g_meta} vs {w_meta}"[:400]
    return close(tree_map(_host, got), want, tolerances(op, dtype))


def close(host, want, tol: dict) -> str:
    """"" when the host results ``host`` match ``want`` at ``tol`` (``assert_close`` keyword
    arguments; PyTorch's defaults when empty), else why not; marked :data:`WITHIN` when
    they match only at the covering tolerance entry's bounds (:data:`TOLERANCE`)."""
    try:
        torch.testing.assert_close(host, want, equal_nan=True, **tol)
    except Exception as exc:
        why = " ".join(str(exc).split())[:400]
        if TOLERANCE is None:
            return why
        from torch.testing._comparison import default_tolerances
        rtol, atol = tol.get("rtol"), tol.get("atol")
        if rtol is None:
            rtol, atol = default_tolerances(*[t for t in tree_flatten(want)[0] if isinstance(t, torch.Tensor)])
        try:
            torch.testing.assert_close(host, want, equal_nan=True, atol=max(atol, TOLERANCE["atol"]),
                                       rtol=max(rtol, TOLERANCE["rtol"]))
        except Exception:
            return why
        return WITHIN + why
    return ""


def forward(op, sample, dtype, seed) -> str | None:
    cpu = to_cpu(sample)
    want, cpu_exc = _run(lambda: cpu.output_process_fn_grad(op(cpu.input, *cpu.args, **cpu.kwargs)), seed)
    got, dev_exc = _run(lambda: sample.output_process_fn_grad(op(sample.input, *sample.args, **sample.kwargs)), seed)
    why = _parity(cpu_exc, dev_exc)
    return why if why is not None else same(got, want, op, dtype, home(sample))


def noncontiguous(op, sample, dtype, seed) -> str | None:
    try:
        cpu = to_cpu(sample).noncontiguous()
    except Exception:
        return None                    # PyTorch cannot make this sample noncontiguous at all
    try:
        nc = sample.noncontiguous()
    except Exception as exc:
        return f"making the sample noncontiguous on fornax: {short(exc)}"
    want, cpu_exc = _run(lambda: cpu.output_process_fn_grad(op(cpu.input, *cpu.args, **cpu.kwargs)), seed)
    got, dev_exc = _run(lambda: nc.output_process_fn_grad(op(nc.input, *nc.args, **nc.kwargs)), seed)
    why = _parity(cpu_exc, dev_exc)
    return why if why is not None else same(got, want, op, dtype, home(nc))


def _tensors_only(x) -> bool:
    return isinstance(x, torch.Tensor) or (isinstance(x, (tuple, list)) and len(x) > 0
                                            and all(isinstance(t, torch.Tensor) for t in x))


def out(op, sample, dtype, seed) -> str | None:
    cpu = to_cpu(sample)
    want, cpu_exc = _run(lambda: op(cpu.input, *cpu.args, **cpu.kwargs), seed)
    if cpu_exc is not None or not _tensors_only(want):
        return None

    def alloc(device):
        if isinstance(want, torch.Tensor):
            return torch.empty_like(want, device=device)
        return tuple(torch.empty_like(t, device=device) for t in want)

    cpu_out = alloc("cpu")
    cpu_ret, cpu_exc = _run(lambda: op(cpu.input, *cpu.args, out=cpu_out, **cpu.kwargs), seed)
    if cpu_exc is not None:
        return None
    dev_out = alloc(DEVICE)
    ret, dev_exc = _run(lambda: op(sample.input, *sample.args, out=dev_out, **sample.kwargs), seed)
    if dev_exc is not None:
        return short(dev_exc)
    outs = dev_out if isinstance(dev_out, tuple) else (dev_out,)
    if cpu_ret is None:          # an out= overload whose schema returns nothing (unbind_copy.int_out)
        if ret is not None:
            return "the op returned a value where its out= overload returns nothing"
    else:
        ret_flat = ret if isinstance(ret, (tuple, list)) else (ret,)
        if len(ret_flat) != len(outs) or any(r is not o for r, o in zip(ret_flat, outs)):
            return "the op did not return its out= tensors"
    return same(dev_out, cpu_out, op, dtype)


def inplace(op, sample, dtype, seed) -> str | None:
    fn = op.get_inplace()
    if fn is None or sample.broadcasts_input:
        return None
    cpu = to_cpu(sample)
    with torch.no_grad():
        cpu_in, dev_in = cpu.input.clone(), sample.input.clone()
    want, cpu_exc = _run(lambda: fn(cpu_in, *cpu.args, **cpu.kwargs), seed)
    got, dev_exc = _run(lambda: fn(dev_in, *sample.args, **sample.kwargs), seed)
    why = _parity(cpu_exc, dev_exc)
    if why is not None:
        return why
    if got is not dev_in:
        return "the in-place op did not return its input"
    return same(dev_in, cpu_in, op, dtype)


def _differentiable(x) -> bool:
    return isinstance(x, torch.Tensor) and x.requires_grad and (x.is_floating_point() or x.is_complex())


def _leaves(sample) -> list:
    return [t for t in tree_flatten((sample.input, sample.args, sample.kwargs))[0] if _differentiable(t)]


def _grads(op, sample, seed):
    outs = sample.output_process_fn_grad(op(sample.input, *sample.args, **sample.kwargs))
    outs = [o for o in tree_flatten(outs)[0] if _differentiable(o)]
    leaves = _leaves(sample)
    if not outs or not leaves:
        return None
    gen = torch.Generator().manual_seed(seed)
    loss = 0
    for o in outs:
        g = torch.randn(o.shape, generator=gen, dtype=torch.float32)
        g = g.to(dtype=o.real.dtype).to(o.device)
        loss = loss + (o.real * g).sum() if o.is_complex() else loss + (o * g).sum()
    return torch.autograd.grad(loss, leaves, allow_unused=True)


def backward(op, sample, dtype, seed) -> str | None:
    cpu = to_cpu(sample)
    want, cpu_exc = _run(lambda: _grads(op, cpu, seed), seed)
    got, dev_exc = _run(lambda: _grads(op, sample, seed), seed)
    why = _parity(cpu_exc, dev_exc)
    if why is not None:
        return why
    if want is None:
        return None
    if got is None:
        return "no differentiable output on fornax"
    none_w = [g is None for g in want]
    none_g = [g is None for g in got]
    if none_w != none_g:
        return f"gradients defined on CPU {none_w}, on fornax {none_g}"
    return same([g for g in got if g is not None], [g for g in want if g is not None], op, dtype)


#: the TestCommon test of PyTorch's ``test_ops.py`` that checks what each variant checks
UPSTREAM_TEST = {"noncontiguous": "test_noncontiguous_samples", "out": "test_out",
                 "inplace": "test_variant_consistency_eager"}


def upstream_skip(op, dtype, variant: str) -> str | None:
    """PyTorch's reason when ``op``'s OpInfo skips the test behind ``variant`` on every device
    type (an unconditional ``unittest.skip`` whose ``DecorateInfo`` names no device), else None."""
    test = UPSTREAM_TEST.get(variant)
    if test is None:
        return None
    for info in op.decorators or ():
        if not hasattr(info, "decorators") or info.device_type is not None or not info.active_if:
            continue
        if info.cls_name not in (None, "TestCommon") or info.test_name != test \
                or (info.dtypes is not None and dtype not in info.dtypes):
            continue
        for d in info.decorators:
            try:
                probe = d(lambda: None)
            except Exception:       # a decorator that needs a real test: not a plain skip
                continue
            if getattr(probe, "__unittest_skip__", False):
                why = getattr(probe, "__unittest_skip_why__", "") or "no reason given"
                return f"PyTorch's OpInfo skips TestCommon.{test} on every device: {why!r}"
    return None


VARIANTS = {"forward": forward, "noncontiguous": noncontiguous, "out": out, "inplace": inplace,
            "backward": backward}
