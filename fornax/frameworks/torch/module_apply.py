"""Parameter identity and ties across ``Module.to()``, ``.cpu()``, ``.half()``, ``.fornax()``.

``nn.Module._apply`` keeps a parameter's Python object (``param.data = new``) only when
``torch._has_compatible_shallow_copy_type(old, new)`` holds.  That C++ check knows a fixed
set of dense backends (CPU, CUDA, HIP, XPU, MPS, ...); PrivateUse1 is not among them, so
every move between ``fornax`` and the CPU makes a *new* ``Parameter`` per module and
parameter slot.  Two things break that do not break on CUDA:

* **ties**: a weight shared by two modules (a language model's ``lm_head.weight`` that is
  its token embedding) becomes two independent tensors, so training silently diverges;
* **identity**: an optimizer built before the move keeps pointing at the old, orphaned
  parameters.

:func:`install` wraps ``nn.Module._apply`` once.  Around the outermost call (the one that
recurses through the children) it notes which ``Parameter`` object sits in every slot of
every submodule; afterwards, for each old parameter that PyTorch replaced, all the slots
that held it receive one object, and that object is the *old* one, given the new contents
with :func:`torch.utils.swap_tensors` (its Python attributes stay; its gradient is the
moved gradient).  Where a swap is impossible (a weak reference to the parameter, or an
autograd graph that still holds it) the ties are restored with the new object instead.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

_FLAG = "_fornax_module_apply"
_local = threading.local()


def install() -> None:
    """Wrap ``nn.Module._apply`` (idempotent: the flag lives on the class)."""
    if getattr(nn.Module, _FLAG, False):
        return
    original = nn.Module._apply

    def _apply(self, fn, recurse=True):
        if getattr(_local, "active", False):
            return original(self, fn, recurse)
        slots = _slots(self, recurse)
        _local.active = True
        try:
            out = original(self, fn, recurse)
        finally:
            _local.active = False
        # RNN modules keep weak references to their parameters (``_flat_weight_refs``), which
        # swap_tensors refuses: drop them for the swap and let the module rebuild them after
        rnns = [m for m in (self.modules() if recurse else (self,)) if hasattr(m, "_flat_weight_refs")]
        for m in rnns:
            m._flat_weight_refs = []
        _reunite(slots)
        for m in rnns:
            m._init_flat_weights()
        return out

    setattr(_apply, "__wrapped__", original)        # functools' convention for a wrapper
    _apply.__doc__ = original.__doc__
    setattr(nn.Module, "_apply", _apply)
    setattr(nn.Module, _FLAG, True)


def _slots(module: nn.Module, recurse: bool) -> list:
    """``(module, name, parameter)`` for every parameter slot ``_apply`` will visit."""
    mods = module.modules() if recurse else (module,)
    return [(m, name, p) for m in mods for name, p in m._parameters.items() if p is not None]


def _reunite(slots: list) -> None:
    """Give every group of slots that held one parameter one object again, the old one."""
    groups: dict[int, tuple] = {}
    for m, name, old in slots:
        new = m._parameters.get(name)
        if new is old or new is None:
            continue
        entry = groups.setdefault(id(old), (old, new, []))
        entry[2].append((m, name))
    for old, new, where in groups.values():
        keep = _swap_into(old, new)
        for m, name in where:
            m._parameters[name] = keep


def _swap_into(old: nn.Parameter, new: nn.Parameter) -> nn.Parameter:
    """``old`` with ``new``'s tensor and gradient (and its own Python attributes); ``new``
    itself where the swap is impossible.  A lazy module's uninitialised parameter stays
    uninitialised on the new device (its first forward materialises it there, as on CUDA)."""
    if nn.parameter.is_lazy(old) and type(new) is nn.Parameter:
        new.__class__ = type(old)
    if type(old) is not type(new):
        return new
    # Tensor._use_count (the TensorImpl's reference count) is missing from torch's stubs
    if old._use_count() > 1 or new._use_count() > 1:  # type: ignore[attr-defined]
        # an autograd graph (or C++ code) still holds the tensor: swapping would poison it
        return new
    attrs = dict(old.__dict__)
    old_grad, new_grad = old.grad, new.grad
    old.grad = None
    new.grad = None
    try:
        torch.utils.swap_tensors(old, new)
    except RuntimeError:
        # a weak reference holds one of them: keep the ties at least
        old.grad = old_grad
        new.grad = new_grad
        return new
    old.__dict__ = attrs
    if new_grad is not None:
        old.grad = new_grad
    return old
