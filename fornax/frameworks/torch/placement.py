"""Placement: which CPU tensors an ATen op may take alongside fornax tensors.

PyTorch's device rule, as CUDA applies it:

- a 0-d CPU tensor is a "CPU scalar" and mixes with device tensors anywhere;
- the ``indices`` of advanced indexing (``Tensor?[] indices`` of ``aten::index``,
  ``aten::index_put_``, ``aten::_index_put_impl_`` and their kin) may live on the CPU:
  ``x[cpu_long_index]``, ``x[cpu_bool_mask] = v`` and ``index_put_`` with CPU indices
  move the indices to the device;
- any other CPU tensor next to a device tensor is refused with PyTorch's message.

A Python number in a ``Tensor`` slot is PyTorch's "wrapped number" (``copysign(t, -1.0)``
reaches ``copysign.out`` with ``other`` wrapped, and the boxed call to a Python kernel
unwraps it back to a float): it becomes a 0-d device tensor of the dtype PyTorch's
promotion gives the op's first tensor with that number, so the result dtype is unchanged.
"""

from __future__ import annotations

import torch

from . import tensors as T

_INDEX_LIST = "List[Optional[Tensor]]"
_INDEX_SLOTS: dict = {}


def _index_slots(op) -> tuple:
    """(position, name) of the op's ``Tensor?[]`` arguments (the advanced-indexing indices)."""
    slots = _INDEX_SLOTS.get(op)
    if slots is None:
        slots = _INDEX_SLOTS[op] = tuple((i, a.name) for i, a in enumerate(op._schema.arguments)
                                         if str(a.type) == _INDEX_LIST)
    return slots


def _foreign(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type != T.DEVICE


def _to_device(x):
    if _foreign(x) and x.device.type == "cpu":
        return T.to_device(x)
    return x


_TENSOR_SLOTS: dict = {}


def _tensor_slots(op) -> tuple:
    """(position, name) of the op's ``Tensor`` / ``Tensor?`` arguments."""
    slots = _TENSOR_SLOTS.get(op)
    if slots is None:
        slots = _TENSOR_SLOTS[op] = tuple((i, a.name) for i, a in enumerate(op._schema.arguments)
                                          if str(a.type) in ("Tensor", "Optional[Tensor]"))
    return slots


def wrap_numbers(op, args: tuple, kwargs: dict):
    """Python numbers in the op's Tensor slots as 0-d fornax tensors (see the module doc)."""
    slots = _tensor_slots(op)
    if not any(isinstance(kwargs.get(n) if n in kwargs else (args[i] if i < len(args) else None),
                          (bool, int, float, complex)) for i, n in slots):
        return args, kwargs
    first = next((x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)), None)
    wrapped, kwargs = list(args), dict(kwargs)
    for i, n in slots:
        if n in kwargs:
            kwargs[n] = _wrapped(kwargs[n], first)
        elif i < len(wrapped):
            wrapped[i] = _wrapped(wrapped[i], first)
    return tuple(wrapped), kwargs


def _wrapped(x, first):
    if isinstance(x, torch.Tensor) or not isinstance(x, (bool, int, float, complex)):
        return x
    dtype = torch.result_type(first, x) if first is not None else torch.tensor(x).dtype
    return T.to_device(torch.tensor(x, dtype=dtype))


def adopt(name: str, op, args: tuple, kwargs: dict, tensors: list):
    """``args``/``kwargs`` with every CPU tensor PyTorch lets mix with fornax tensors moved
    to the device; raises PyTorch's RuntimeError for any other foreign tensor.  ``tensors``:
    the op's tensor arguments (one list level deep), to skip all work in the common case."""
    if not any(_foreign(x) for x in tensors):
        return args, kwargs
    slots = _index_slots(op)
    if slots:
        moved, kwargs = list(args), dict(kwargs)
        for pos, arg in slots:
            if arg in kwargs:
                kwargs[arg] = _move_indices(kwargs[arg])
            elif pos < len(moved):
                moved[pos] = _move_indices(moved[pos])
        args = tuple(moved)

    def place(x):
        if not _foreign(x):
            return x
        if x.dim() == 0 and x.device.type == "cpu":
            return T.to_device(x)
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"fornax:0 and {x.device}! ({name})")
    return _map(place, args), {k: _map(place, v) for k, v in kwargs.items()}


def _move_indices(indices):
    if isinstance(indices, (list, tuple)):
        return type(indices)(_to_device(ix) for ix in indices)
    return indices


def _map(fn, x):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, tuple):
        return tuple(_map(fn, v) for v in x)
    if isinstance(x, list):
        return [_map(fn, v) for v in x]
    return x
