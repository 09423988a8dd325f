"""PyTorch's lazy math bits (conjugate and negative) on fornax tensors.

``z.conj()`` of a complex tensor, ``torch._neg_view`` and ``z.conj().imag`` return views
whose *logical* values are the conjugate (or negation) of the bytes in their storage; a
flag on the tensor says so.  PyTorch's own ``Conjugate``/``Negative`` fallback resolves the
flag before most ops, but copies (``_copy_from``, ``_to_copy``), ``clone`` and a few ops
it trusts to read the flag (``mm``, ``dot``, ``addmm``...) reach the device with the flag
still set.  Every kernel of the device reads raw bytes, so the flag is honoured here (and,
for copies between the host and the device, in :func:`.tensors.read` / :func:`.tensors.write`):

* :func:`copy` copies one fornax tensor into another, conjugating or negating the bytes
  when the two tensors' flags differ;
* :func:`resolved` replaces a flagged input with a fresh tensor of its logical values;
* :func:`carry` gives a view the flags its meta twin has.
"""

from __future__ import annotations

import torch

from . import tensors as T

aten = torch.ops.aten


def flagged(t) -> bool:
    """Whether ``t`` is a tensor whose logical values differ from its bytes."""
    return isinstance(t, torch.Tensor) and (t.is_conj() or t.is_neg())


def raw(t: torch.Tensor) -> torch.Tensor:
    """A fornax view of ``t``'s bytes with no flag (same storage, sizes, strides, offset)."""
    return T.wrap(t.untyped_storage(), tuple(t.shape), tuple(t.stride()), t.dtype, int(t.storage_offset()))


def copy(dst: torch.Tensor, src: torch.Tensor, copy_raw, run) -> torch.Tensor:
    """``dst.copy_(src)`` between fornax tensors when either carries a flag: the raw bytes
    of ``src`` are conjugated / negated where the flags of the two differ, then copied by
    ``copy_raw(dst, src)`` (flag-free tensors); ``run(op, x)`` runs a unary ATen op."""
    value = raw(src)
    if src.is_conj() != dst.is_conj():
        value = run(aten.conj_physical.default, value)
    if src.is_neg() != dst.is_neg():
        value = run(aten.neg.default, value)
    copy_raw(raw(dst), value)
    return dst


def resolved(t: torch.Tensor, copy_raw, run) -> torch.Tensor:
    """A new fornax tensor holding ``t``'s logical values (``t`` when it has no flag)."""
    if not flagged(t):
        return t
    out = T.empty(tuple(t.shape), t.dtype)
    return copy(out, t, copy_raw, run)


def carry(view: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """Set on ``view`` the conjugate / negative flags its meta twin ``meta`` carries."""
    if meta.is_conj():
        torch._C._set_conj(view, True)
    if meta.is_neg():
        torch._C._set_neg(view, True)
    return view
