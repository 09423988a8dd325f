"""2:4 semi-structured sparse weights on the fornax device, through the library's sparse GEMM.

PyTorch's own route, ``torch.sparse.to_sparse_semi_structured``, builds a
``SparseSemiStructuredTensor`` only from a CUDA tensor (its constructor checks
``is_cuda``) and computes through CUDA kernels (CUTLASS or cuSPARSELt), so a fornax tensor
cannot take it.  This module gives the same contract on the fornax device:
:func:`to_sparse_semi_structured` takes a 2:4-sparse ``[out, in]`` weight (prune it first,
e.g. with :func:`prune_2to4`), compresses it with the stack library's compress call, and
returns a :class:`SemiStructuredWeight` tensor; ``F.linear(x, w, bias)``, ``torch.mm(w, b)``
and ``w @ b`` on it run the library's 2:4 matmul on the compressed weight, and
``w.to_dense()`` gives the dense (pruned) matrix back.  As with PyTorch's own route,
``linear.weight = nn.Parameter(w, requires_grad=False)`` makes an ``nn.Linear`` run on it
(for inference: the weight is frozen, and an input that requires a gradient is refused,
since no gradient flows through the compressed product).  Any other op on it raises
``NotImplementedError`` naming the op.  A family whose library has no 2:4 GEMM refuses at
:func:`to_sparse_semi_structured` with its own code.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...layers.errors import FornaxError
from . import tensors as T
from .session import current
from .streams import current_runtime_stream

_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _dtype(t: torch.Tensor, what: str) -> str:
    if t.dtype not in _DTYPES:
        raise FornaxError(f"{what}: 2:4 sparse weights are float16 or bfloat16, got {t.dtype}",
                          seam="framework", op="to_sparse_semi_structured",
                          hint="cast the weight with .to(torch.bfloat16) first")
    return _DTYPES[t.dtype]


def _check(w: torch.Tensor, what: str) -> str:
    if not T.is_fornax(w):
        raise FornaxError(f"{what}: the weight is on {w.device}, not the fornax device",
                          seam="framework", op="to_sparse_semi_structured",
                          hint="move it with .to('fornax') first")
    if w.dim() != 2:
        raise FornaxError(f"{what}: a 2:4 weight is a 2-D [out, in] matrix, got shape "
                          f"{tuple(w.shape)}", seam="framework", op="to_sparse_semi_structured")
    return _dtype(w, what)


def prune_2to4(w: torch.Tensor) -> torch.Tensor:
    """A new fornax tensor: ``w`` pruned to 2:4 along its last axis by the library's prune
    call (the two largest magnitudes of every four kept)."""
    dtype = _check(w, "prune_2to4")
    session = current()
    src = w.contiguous()
    out = torch.empty_like(src)
    session.stack.library.sparse_prune(T.address(src, session), T.address(out, session),
                                       {"m": int(w.shape[0]), "k": int(w.shape[1]), "dtype": dtype},
                                       current_runtime_stream(session))
    return out


class SemiStructuredWeight(torch.Tensor):
    """A compressed 2:4 ``[out, in]`` weight on the fornax device (see the module docstring)."""

    compressed: torch.Tensor
    library_dtype: str

    @staticmethod
    def __new__(cls, shape: torch.Size, dtype: torch.dtype, device: torch.device,
                compressed: torch.Tensor, library_dtype: str) -> "SemiStructuredWeight":
        self = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=device,
                                                   requires_grad=False)
        self.compressed = compressed
        self.library_dtype = library_dtype
        return self

    def __repr__(self) -> str:  # type: ignore[override]
        return (f"SemiStructuredWeight(shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"compressed_bytes={self.compressed.numel()})")

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if isinstance(w, SemiStructuredWeight) and not isinstance(x, SemiStructuredWeight):
                return w._linear(x, bias)
        if func in (torch.mm, torch.matmul, torch.Tensor.mm, torch.Tensor.matmul,
                    torch.Tensor.__matmul__):
            a, b = args[0], args[1]
            if isinstance(a, SemiStructuredWeight) and not isinstance(b, SemiStructuredWeight) \
                    and b.dim() == 2:
                return a._linear(b.t(), None).t()
        if func is torch.Tensor.to_dense:
            return args[0]._dense()
        # metadata (shape, dtype, device, repr) is answered by the wrapper; any op that reaches
        # the dispatcher is refused there, naming it
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (),  # type: ignore[override]
                           kwargs: Any = None) -> Any:   # torch types it as a plain attribute
        if func is torch.ops.aten.detach.default:
            # nn.Parameter(w) detaches: the same compressed weight, outside autograd
            w = args[0]
            return SemiStructuredWeight(w.shape, w.dtype, w.device, w.compressed, w.library_dtype)
        raise NotImplementedError(
            f"{func} is not supported on a 2:4 SemiStructuredWeight (supported: F.linear(x, w, "
            "bias), torch.mm(w, b), w @ b, w.to_dense())")

    def _linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ self^T + bias`` for ``x`` of shape ``[..., in]``: the library's 2:4 matmul with
        ``A = self`` (``out x in``) and ``B = x^T`` (``x`` read as stored), written as ``C^T``."""
        out_f, in_f = int(self.shape[0]), int(self.shape[1])
        if not T.is_fornax(x) or x.dtype != self.dtype or x.shape[-1] != in_f:
            raise FornaxError(f"F.linear with a 2:4 {self.dtype} weight [{out_f}, {in_f}] needs a "
                              f"fornax {self.dtype} input [..., {in_f}], got {x.dtype} "
                              f"{tuple(x.shape)} on {x.device}", seam="framework", op="linear",
                              hint="move and cast the input to match the weight")
        if torch.is_grad_enabled() and x.requires_grad:
            raise FornaxError("F.linear with a 2:4 SemiStructuredWeight computes no gradient, and "
                              "the input requires one", seam="framework", op="linear",
                              hint="run the sparse layer for inference, under torch.no_grad() or "
                                   "torch.inference_mode()")
        session = current()
        lib = session.stack.library
        lead = tuple(x.shape[:-1])
        rows = 1
        for d in lead:
            rows *= int(d)
        align = int(lib.sparse_info().get("alignment", 1))
        padded = -(-max(rows, 1) // align) * align
        x2 = x.reshape(rows, in_f)
        if padded != rows:
            x2 = F.pad(x2, (0, 0, 0, padded - rows))
        x2 = x2.contiguous()
        y = torch.empty((padded, out_f), dtype=self.dtype, device=x.device)
        params: dict[str, Any] = {"m": out_f, "n": padded, "k": in_f, "dtype": self.library_dtype,
                                  "trans_b": True, "c_col": True}
        if bias is not None:
            if not T.is_fornax(bias) or bias.dtype != self.dtype or tuple(bias.shape) != (out_f,):
                raise FornaxError(f"F.linear bias must be a fornax {self.dtype} [{out_f}] tensor, "
                                  f"got {bias.dtype} {tuple(bias.shape)}", seam="framework",
                                  op="linear")
            bias = bias.contiguous()
            params["bias"] = T.address(bias, session)
        lib.sparse_matmul(T.address(self.compressed, session), T.address(x2, session),
                          T.address(y, session), params, current_runtime_stream(session))
        return y[:rows].reshape(*lead, out_f)

    def _dense(self) -> torch.Tensor:
        """The dense (pruned) weight: the compressed one times the identity."""
        in_f = int(self.shape[1])
        eye = torch.eye(in_f, dtype=self.dtype).to(self.device)
        return self._linear(eye, None).t().contiguous()


def to_sparse_semi_structured(w: torch.Tensor) -> SemiStructuredWeight:
    """Compress the 2:4-sparse fornax weight ``w`` (``[out, in]``, float16 or bfloat16) with
    the stack library's compress call; a weight that is not 2:4 along ``in`` raises the
    family's error (prune it first with :func:`prune_2to4`)."""
    dtype = _check(w, "to_sparse_semi_structured")
    session = current()
    lib = session.stack.library
    params = {"m": int(w.shape[0]), "k": int(w.shape[1]), "dtype": dtype}
    size, _ = lib.sparse_compressed_size(params)
    compressed = torch.empty(size, dtype=torch.uint8, device=w.device)
    src = w.contiguous()
    lib.sparse_compress(T.address(src, session), T.address(compressed, session), params,
                        current_runtime_stream(session))
    return SemiStructuredWeight(w.shape, w.dtype, w.device, compressed, dtype)
