"""Sparse COO tensors on the fornax device (``torch.sparse_coo`` layout).

A sparse COO tensor is two dense tensors, ``indices`` (``sparse_dim`` x nnz, int64) and
``values`` (nnz x dense dims), held by ATen's ``SparseTensorImpl``.  PyTorch dispatches
every op on such a tensor to the ``SparsePrivateUse1`` key, which PyTorch fills for the
CPU and CUDA in C++.  Here, as CUDA's sparse kernels do (``aten/src/ATen/native/sparse/``),
two kinds of kernel fill it for fornax:

* **structure** (:data:`STRUCTURAL`): building the ``SparseTensorImpl`` around fornax
  indices and values, reading them back, resizing, cloning.  ATen's kernels for these are
  device-generic bookkeeping (they never touch element bytes themselves), so the CPU
  registration runs on the fornax tensors unchanged;
* **arithmetic** (:data:`KERNELS`): coalescing, densifying, adding into dense or sparse
  tensors, masking, scaling, sparse @ dense (``mm``, ``addmm``).  Each is composed of dense ATen ops on the
  indices and values, so every byte moves through the device's own routes (and shows in
  the report, counted ``decomposed``).

That is what a sparse gradient needs: ``nn.Embedding(sparse=True)``'s backward,
gradient accumulation, ``SparseAdam``, and ``.to("cpu")`` / ``.to("fornax")``.  Other
sparse ops (sparse @ sparse, sparse softmax, the CSR/CSC/BSR layouts) raise PyTorch's
``NotImplementedError`` naming the op and the ``Sparsefornax`` backend.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
KEY = "SparsePrivateUse1"
_SPARSE_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCPU)

#: ATen's device-generic SparseTensorImpl bookkeeping, run through its CPU registration
STRUCTURAL = ("_sparse_coo_tensor_with_dims_and_tensors", "_sparse_coo_tensor_with_dims",
              "_indices", "_values", "indices", "values", "_nnz", "sparse_dim", "dense_dim",
              "is_coalesced", "_coalesced_", "sparse_resize_", "sparse_resize_and_clear_",
              "clone", "empty.memory_format", "_dimI", "_dimV", "copy_sparse_to_sparse_")


def _build(indices, values, size, coalesced: bool):
    return aten._sparse_coo_tensor_with_dims_and_tensors(
        indices.shape[0], values.dim() - 1, list(size), indices, values,
        dtype=values.dtype, layout=torch.sparse_coo, device=values.device,
        is_coalesced=coalesced)


def _linear(indices, size):
    """One int64 key per nonzero: its sparse coordinates in row-major order."""
    key = torch.zeros(indices.shape[1], dtype=torch.int64, device=indices.device)
    for d in range(indices.shape[0]):
        key = key * int(size[d]) + indices[d]
    return key


def coalesce(self):
    """Sorted, duplicate-free indices; duplicates' values summed (ATen's ``_coalesce``)."""
    sparse_dim, size = self.sparse_dim(), self.shape
    indices, values = self._indices(), self._values()
    if indices.shape[1] < 2:
        return _build(indices.clone(), values.clone(), size, True)
    keys, inverse = torch.unique(_linear(indices, size), sorted=True, return_inverse=True)
    summed = torch.zeros((keys.shape[0],) + tuple(values.shape[1:]), dtype=values.dtype,
                         device=values.device).index_add_(0, inverse, values)
    coords = []
    for d in reversed(range(sparse_dim)):
        coords.append(keys.remainder(int(size[d])))
        keys = keys.div(int(size[d]), rounding_mode="floor")
    return _build(torch.stack(coords[::-1]) if coords else indices[:, :0], summed, size, True)


def to_dense(self, dtype=None, masked_grad=None):
    out = torch.zeros(self.shape, dtype=dtype or self.dtype, device=self.device)
    return _accumulate(out, self, 1)


def _accumulate(dense, sparse, alpha):
    """``dense += alpha * sparse`` in place (duplicates add up, as they do on the CPU)."""
    values = _alpha_scaled(sparse, alpha)
    if values.numel():
        dense.index_put_(tuple(sparse._indices()), values.to(dense.dtype), accumulate=True)
    return dense


def _alpha_scaled(other, alpha):
    return other._values() if alpha == 1 else other._values() * alpha


def add(self, other, alpha=1):
    if self.is_sparse and other.is_sparse:
        _check_same_size(self, other, "add")
        values = torch.cat([self._values(), _alpha_scaled(other, alpha).to(self._values().dtype)])
        return _build(torch.cat([self._indices(), other._indices()], 1), values, self.shape, False)
    if other.is_sparse:                       # dense + sparse -> dense
        _check_same_size(self, other, "add")
        dtype = torch.promote_types(self.dtype, other.dtype)
        return _accumulate(self.to(dtype, copy=True), other, alpha)
    raise RuntimeError("add(sparse, dense) is not supported. Use add(dense, sparse) instead.")


def add_(self, other, alpha=1):
    if not self.is_sparse:                    # dense += sparse
        _check_same_size(self, other, "add_")
        return _accumulate(self, other, alpha)
    return aten.copy_sparse_to_sparse_(self, add(self, other, alpha))


def add_out(self, other, alpha=1, out=None):
    result = add(self, other, alpha=alpha)
    if out.is_sparse:
        return aten.copy_sparse_to_sparse_(out, result)
    out.resize_(result.shape)
    return out.copy_(result)


def _check_same_size(a, b, op):
    if tuple(a.shape) != tuple(b.shape):
        raise RuntimeError(f"{op}: expected sizes of 'self' and 'other' to match, but "
                           f"{list(a.shape)} != {list(b.shape)}")


def sparse_mask(self, mask):
    """The dense ``self`` read at ``mask``'s nonzeros, as a sparse tensor with its indices."""
    indices = mask._indices()
    values = self[tuple(indices)] if indices.shape[1] else \
        self.new_zeros((0,) + tuple(self.shape[mask.sparse_dim():]))
    return _build(indices.clone(), values, self.shape, mask.is_coalesced())


def _on_values(fn):
    def kernel(self, *args, **kwargs):
        return _build(self._indices().clone(), fn(self._values(), *args, **kwargs), self.shape,
                      self.is_coalesced())
    return kernel


def _on_values_(fn):
    def kernel(self, *args, **kwargs):
        fn(self._values(), *args, **kwargs)
        return self
    return kernel


def _scalar(other):
    if isinstance(other, torch.Tensor) and (other.is_sparse or other.dim() != 0):
        raise NotImplementedError("fornax: a sparse tensor multiplies or divides by a "
                                  "scalar (or a 0-dim tensor) only")
    return other


def mul(self, other):
    return _on_values(torch.mul)(self, _scalar(other))


def div(self, other, rounding_mode=None):
    return _on_values(torch.div)(self, _scalar(other), rounding_mode=rounding_mode)


def zero_(self):
    return aten.sparse_resize_and_clear_(self, list(self.shape), self.sparse_dim(), self.dense_dim())


def mm(self, mat2):
    """sparse (2-D, no dense dims) @ dense: each nonzero adds ``v * mat2[col]`` to its row."""
    if not self.is_sparse or mat2.is_sparse or self.dense_dim() or self.dim() != 2:
        raise NotImplementedError("fornax: sparse mm supports a 2-D sparse matrix times a dense one")
    if self.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({self.shape[0]}x{self.shape[1]} "
                           f"and {mat2.shape[0]}x{mat2.shape[1]})")
    rows, cols = self._indices()
    dtype = torch.promote_types(self.dtype, mat2.dtype)
    out = torch.zeros(self.shape[0], mat2.shape[1], dtype=dtype, device=mat2.device)
    return out.index_add_(0, rows, mat2[cols].to(dtype) * self._values().to(dtype)[:, None])


def addmm(self, mat1, mat2, beta=1, alpha=1):
    """``beta * self + alpha * (mat1 @ mat2)`` with a sparse ``mat1`` (``beta=0`` ignores
    ``self``, NaNs included, as ATen does)."""
    product = mm(mat1, mat2)
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        return product
    return product + (self if beta == 1 else self * beta)


def sum_all(self, dtype=None):
    return self._values().sum(dtype=dtype)


def to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    if layout not in (None, torch.sparse_coo):
        if layout == torch.strided:
            return to_dense(self, dtype).to(device=device)
        raise NotImplementedError(f"fornax: sparse COO to {layout} is not supported")
    device = torch.device(device) if device is not None else self.device
    return aten._sparse_coo_tensor_with_dims_and_tensors(
        self.sparse_dim(), self.dense_dim(), list(self.shape),
        self._indices().to(device), self._values().to(device=device, dtype=dtype or self.dtype),
        dtype=dtype or self.dtype, layout=torch.sparse_coo, device=device,
        is_coalesced=self.is_coalesced())


def to_sparse(self, layout=None, blocksize=None, dense_dim=None):
    """A dense fornax tensor as sparse COO: the nonzero positions of its leading
    ``sparse_dim`` dimensions (any nonzero across the trailing ``dense_dim`` ones)."""
    if layout not in (None, torch.sparse_coo) or blocksize is not None:
        raise NotImplementedError(f"fornax: to_sparse to {layout} (blocksize {blocksize}) is not "
                                  f"supported; the device has sparse COO kernels only")
    return to_sparse_dims(self, self.dim() - (dense_dim or 0))


def to_sparse_dims(self, sparse_dim):
    if not 0 <= sparse_dim <= self.dim():      # ATen's messages (dense_to_sparse)
        raise RuntimeError(f"dense_to_sparse: sparse_dim argument must be in [0,{self.dim()}] range, "
                           f"but {sparse_dim} is given")
    if sparse_dim == 0 and self.dim() > 0:
        raise RuntimeError("dense_to_sparse: sparse_dim argument must be in >0 when self.dim()>0")
    nonzero = self != 0
    if sparse_dim < self.dim():
        nonzero = nonzero.flatten(sparse_dim).any(-1)
    indices = nonzero.nonzero().T.contiguous() if sparse_dim else \
        torch.zeros(0, 1, dtype=torch.int64, device=self.device)
    values = self[tuple(indices)] if sparse_dim else self[None].clone()
    return aten._sparse_coo_tensor_with_dims_and_tensors(
        sparse_dim, self.dim() - sparse_dim, list(self.shape), indices, values,
        dtype=self.dtype, layout=torch.sparse_coo, device=self.device, is_coalesced=True)


#: dense fornax tensors made sparse (the PrivateUse1 key: their input is strided)
DENSE_KERNELS = {
    "_to_sparse": to_sparse,
    "_to_sparse.sparse_dim": to_sparse_dims,
}

KERNELS = {
    "_coalesce": coalesce,
    "_to_dense": to_dense,
    "add.Tensor": add,
    "add_.Tensor": add_,
    "add.out": add_out,
    "sparse_mask": sparse_mask,
    "mul.Tensor": mul,
    "mul.Scalar": mul,
    "div.Tensor": div,
    "div.Scalar": div,
    "div.Tensor_mode": div,
    "neg": _on_values(torch.neg),
    "mul_.Tensor": lambda self, other: _on_values_(torch.Tensor.mul_)(self, _scalar(other)),
    "mul_.Scalar": _on_values_(torch.Tensor.mul_),
    "div_.Tensor": lambda self, other: _on_values_(torch.Tensor.div_)(self, _scalar(other)),
    "div_.Scalar": _on_values_(torch.Tensor.div_),
    "neg_": _on_values_(torch.Tensor.neg_),
    "zero_": zero_,
    "mm": mm,
    "addmm": addmm,
    "sum": sum_all,
    "_to_copy": to_copy,
}


def _structural(op):
    def kernel(*args, **kwargs):
        return op.redispatch(_SPARSE_CPU, *args, **kwargs)
    return kernel


def register(libraries: list, overload, accounted) -> None:
    """Fill fornax's ``SparsePrivateUse1`` key: :data:`STRUCTURAL` through ATen's generic
    kernels, :data:`KERNELS` through ``accounted`` (the session's route counting)."""
    lib = torch.library.Library("aten", "IMPL")
    libraries.append(lib)
    for name in STRUCTURAL:
        lib.impl(name, _structural(overload(name)), KEY)
    for name, fn in KERNELS.items():
        lib.impl(name, accounted(name, fn), KEY)
    for name, fn in DENSE_KERNELS.items():
        lib.impl(name, accounted(name, fn), "PrivateUse1")
