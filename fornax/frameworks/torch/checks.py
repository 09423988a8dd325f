"""Checks: the argument validation PyTorch's CPU kernels perform, done before anything
launches on the fornax device, with PyTorch's exception types and messages.

The eager router answers most ops by lowering them to device graphs, by running their
functional twin (in-place and ``out=`` forms) or by a decomposition; none of those paths
sees the checks ATen's own kernels make.  :func:`validate` runs the ones that depend on
the arguments only (dtypes, shapes, index values), before the op is routed:

- advanced indexing (``index``, ``index_put_``): every integer index within
  ``[-size, size)`` of the dimension it indexes (``IndexError``, as on the CPU; CUDA can
  only assert on the device);
- ``all`` / ``any`` with ``out=``: the result must be bool or uint8;
- reductions over a dimension of a tensor with more than 64 dimensions;
- ``abs_`` on a complex tensor; ``index_fill`` of a real tensor with a complex value;
- ``var`` / ``std`` (and ``*_mean``): the degrees-of-freedom warning when the correction
  is not below the reduction factor;
- ``native_group_norm``: the input must be contiguous (ATen checks this for every device
  but the CPU, which also accepts channels-last).

:func:`castable` is TensorIterator's rule for element-wise ops writing into an existing
tensor: the result dtype must cast to the output's dtype under ``torch.can_cast``.
"""

from __future__ import annotations

import math
import warnings

import torch

from . import tensors as T

MAX_DIMS = 64

#: c10's ScalarType names, as ATen's messages spell them
SCALAR_NAMES = {torch.float64: "Double", torch.float32: "Float", torch.float16: "Half",
                torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int",
                torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
                torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
                torch.complex32: "ComplexHalf"}

_INDEX_OPS = frozenset({"aten::index.Tensor", "aten::index.Tensor_out", "aten::index_put_",
                        "aten::index_put", "aten::index_put.out", "aten::_index_put_impl_",
                        "aten::_index_put_impl", "aten::_index_put_impl.out"})
_DOF_OPS = {"var": "var", "std": "std", "var_mean": "var_mean", "std_mean": "std_mean"}


def scalar_name(dtype: torch.dtype) -> str:
    return SCALAR_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def per_call(name: str) -> bool:
    """Whether :func:`validate` must see every call of ``name`` (its check reads the data or
    warns each time), so the eager dispatch cache cannot stand in for it."""
    return name in _INDEX_OPS or name.removeprefix("aten::").partition(".")[0] in _DOF_OPS


def validate(name: str, op, args: tuple, kwargs: dict) -> None:
    """Raise (or warn) as PyTorch's CPU kernel of ``op`` would for these arguments."""
    if name in _INDEX_OPS:
        _index_bounds(op, args, kwargs)
        return
    base = name.removeprefix("aten::").partition(".")[0]
    if base in ("all", "any") and "out" in kwargs:
        out = kwargs["out"]
        if isinstance(out, torch.Tensor) and out.dtype not in (torch.bool, torch.uint8):
            raise RuntimeError(f"{base} only supports bool tensor for result, got: "
                               f"{scalar_name(out.dtype)}")
    elif base == "abs_":
        if args and isinstance(args[0], torch.Tensor) and args[0].is_complex():
            raise RuntimeError("In-place abs is not supported for complex tensors.")
    elif base in ("index_fill", "index_fill_"):
        value = _argument(op, args, kwargs, "value")
        if isinstance(value, complex) and not args[0].is_complex():
            raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type is not "
                               "supported")
    elif base in _DOF_OPS:
        _degrees_of_freedom(_DOF_OPS[base], op, args, kwargs)
    elif base == "native_group_norm":
        x = args[0] if args else kwargs.get("input")
        if isinstance(x, torch.Tensor) and not x.is_contiguous():
            raise RuntimeError("Expected X.is_contiguous(memory_format) to be true, but got false.  "
                               "(Could this error message be improved?  If so, please report an "
                               "enhancement request to PyTorch.)")
    if args and isinstance(args[0], torch.Tensor) and args[0].dim() > MAX_DIMS and \
            torch.Tag.reduction in op.tags and _argument(op, args, kwargs, "dim") is not None:
        raise RuntimeError(f"only tensors with up to {MAX_DIMS} dims are supported")


def _argument(op, args, kwargs, name: str, default=None):
    if name in kwargs:
        return kwargs[name]
    for i, a in enumerate(op._schema.arguments):
        if a.name == name:
            return args[i] if i < len(args) else default
    return default


# -- advanced indexing --------------------------------------------------------------------------
def _host(t: torch.Tensor) -> torch.Tensor:
    return T.read(t) if T.is_fornax(t) else t


def _index_bounds(op, args, kwargs) -> None:
    self = _argument(op, args, kwargs, "self")
    indices = _argument(op, args, kwargs, "indices")
    if not isinstance(self, torch.Tensor) or not isinstance(indices, (list, tuple)):
        return
    dim = 0            # the dimension of ``self`` an index applies to
    k = 0              # its place among the indexed dimensions: what ATen's message names
    for ix in indices:
        if ix is None:
            dim += 1
            continue
        if ix.dtype in (torch.bool, torch.uint8):
            dim += max(ix.dim(), 1)        # a mask covers as many dims as it has (shape-checked by ATen)
            k += max(ix.dim(), 1)
            continue
        if dim >= self.dim() or ix.numel() == 0 or ix.is_floating_point() or ix.is_complex():
            dim, k = dim + 1, k + 1
            continue                        # too many indices / wrong dtype: ATen's own checks say so
        size = self.shape[dim]
        if size == 0:
            raise IndexError("index is out of bounds for dimension with size 0")
        values = _host(ix).reshape(-1)
        bad = (values < -size) | (values >= size)
        if bool(bad.any()):
            v = int(values[bad.nonzero()[0, 0]])
            raise IndexError(f"index {v} is out of bounds for dimension {k} with size {size}")
        dim, k = dim + 1, k + 1


# -- var / std ------------------------------------------------------------------------------------
def _degrees_of_freedom(fname: str, op, args, kwargs) -> None:
    self = _argument(op, args, kwargs, "self")
    if not isinstance(self, torch.Tensor) or not self.is_floating_point():
        return      # complex: ATen (and fornax's route) reduces the real and imaginary parts, which warn
    correction = _argument(op, args, kwargs, "correction")
    if correction is None:
        unbiased = _argument(op, args, kwargs, "unbiased")
        correction = 0 if unbiased is False else 1
    dims = _argument(op, args, kwargs, "dim")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = range(self.dim())
    elif isinstance(dims, int):
        dims = [dims]
    ndim = max(self.dim(), 1)
    reduced = {d % ndim for d in dims}
    shape = tuple(self.shape) or (1,)
    out_numel = math.prod(n for d, n in enumerate(shape) if d not in reduced)
    factor = self.numel() // out_numel if out_numel else 0
    if factor - float(correction) <= 0:
        warnings.warn(f"{fname}(): degrees of freedom is <= 0. Correction should be strictly "
                      "less than the reduction factor (input numel divided by output numel).",
                      UserWarning, stacklevel=4)


# -- element-wise ops writing into an existing tensor -----------------------------------------------
_RESULT_DTYPES: dict = {}


def _promotion_key(x):
    if isinstance(x, torch.Tensor):
        return (x.dtype, x.dim() == 0)
    if isinstance(x, (list, tuple)):
        return tuple(_promotion_key(v) for v in x)
    if isinstance(x, (bool, int, float, complex)):
        return type(x)
    return x if isinstance(x, (str, type(None), torch.dtype)) else type(x)


def castable(name: str, functional, fargs: tuple, fkwargs: dict, outs: list, to_meta) -> None:
    """TensorIterator's output rule for an element-wise in-place / ``out=`` op: each result
    dtype of the functional twin (found on meta tensors, ``to_meta`` maps the arguments;
    cached by the arguments' dtypes) must cast to its output's dtype."""
    if torch.Tag.pointwise not in functional.tags:
        return
    key = (functional, _promotion_key(list(fargs)), _promotion_key(sorted(fkwargs.items())))
    dtypes = _RESULT_DTYPES.get(key)
    if dtypes is None:
        try:
            margs, mkwargs = to_meta((fargs, fkwargs))
            res = functional(*margs, **mkwargs)
        except Exception:          # no meta kernel, or the op itself rejects: its own path says so
            return
        flat = res if isinstance(res, (tuple, list)) else (res,)
        dtypes = _RESULT_DTYPES[key] = tuple(r.dtype if isinstance(r, torch.Tensor) else None
                                             for r in flat)
    for dt, out in zip(dtypes, outs):
        if dt is not None and isinstance(out, torch.Tensor) and not torch.can_cast(dt, out.dtype):
            raise RuntimeError(f"result type {scalar_name(dt)} can't be cast to the desired "
                               f"output type {scalar_name(out.dtype)}")
