"""The library seam: named library routines (BLAS-like GEMM; DNN and collectives beside it).

A library sits on the runtime seam, like cuBLAS on the CUDA runtime.  It
ships its kernels as binaries in its family's format for a list of targets
(``vendor.toml`` ``[library]``); on a device outside that list it fails the
way real libraries do, unless one of its images is a virtual ISA the driver
can JIT for the device.  Each call picks an algorithm by a heuristic over
shape, dtype and compute units (or, for GEMM, by an autotuner that prices
every candidate with the simulator's cost model), and says why.

:class:`Library` is the seam's contract: everything a front end, the
compiler's plans, the stack, the report, ``compare``, ``qualify`` and the
conformance suites call on a library.  :class:`LibraryBase` is the shared
implementation a family subclasses; it composes

* :mod:`fornax.layers.library_core` -- facts, shipped images, the call log;
* :mod:`fornax.layers.gemm` -- GEMM (cuBLASLt-shaped; kernels in :mod:`fornax.layers.blas`);
* :mod:`fornax.layers.dnn` -- convolution, attention, norms, softmax, pooling;
* :mod:`fornax.layers.collectives` -- communicators (NCCL/RCCL/oneCCL-like).

Every routine takes device addresses (ints, the current device's primary
context) and a ``params`` dict, orders its work on ``stream`` (the default
stream when None), returns a :class:`~fornax.layers.call_record.CallRecord`
and appends it to ``calls``.  Failures the caller can cause are
:class:`~fornax.layers.errors.LibraryError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from .call_record import CallRecord
from .collectives import Communicator
from .dnn import DnnRoutines
from .gemm import SPLIT_K_FILL, SPLIT_K_MIN_STEPS, Algorithm, GemmProblem, GemmRoutines
from .library_core import LibraryCore, ShippedImage
from .runtime import Stream

__all__ = ["SPLIT_K_FILL", "SPLIT_K_MIN_STEPS", "Algorithm", "CallRecord", "GemmProblem", "Library",
           "LibraryBase", "LibraryCore", "ShippedImage"]


@runtime_checkable
class Library(Protocol):
    vendor: str
    name: str

    def formats(self) -> tuple[str, ...]: ...
    def ops(self) -> frozenset: ...
    def gemm(self, a: int, b: int, c: int, params: dict, stream: Stream | None = None) -> CallRecord: ...
    # DNN-like routines (shared policy in layers/dnn.py; device addresses plus a params dict)
    def conv2d_fwd(self, x: int, w: int, y: int, params: dict, stream=None) -> CallRecord: ...
    def conv2d_bwd_data(self, dy: int, w: int, dx: int, params: dict, stream=None) -> CallRecord: ...
    def conv2d_bwd_weights(self, x: int, dy: int, dw: int, params: dict, stream=None) -> CallRecord: ...
    def attention_fwd(self, q: int, k: int, v: int, o: int, lse: int, params: dict,
                      stream=None) -> CallRecord: ...
    def attention_bwd(self, q: int, k: int, v: int, o: int, do: int, lse: int, dq: int, dk: int,
                      dv: int, params: dict, stream=None) -> CallRecord: ...
    def layer_norm_fwd(self, x: int, gamma: int, beta: int, y: int, mean: int, rstd: int,
                       params: dict, stream=None) -> CallRecord: ...
    def layer_norm_bwd(self, dy: int, x: int, gamma: int, mean: int, rstd: int, dx: int,
                       dgamma: int, dbeta: int, params: dict, stream=None) -> CallRecord: ...
    def rms_norm_fwd(self, x: int, gamma: int, y: int, rstd: int, params: dict,
                     stream=None) -> CallRecord: ...
    def rms_norm_bwd(self, dy: int, x: int, gamma: int, rstd: int, dx: int, dgamma: int,
                     params: dict, stream=None) -> CallRecord: ...
    def softmax_fwd(self, x: int, y: int, params: dict, stream=None) -> CallRecord: ...
    def softmax_bwd(self, y: int, dy: int, dx: int, params: dict, stream=None) -> CallRecord: ...
    def pool2d_fwd(self, x: int, y: int, params: dict, indices: int | None = None,
                   stream=None) -> CallRecord: ...
    def pool2d_bwd(self, dy: int, dx: int, params: dict, indices: int | None = None,
                   stream=None) -> CallRecord: ...
    # collectives (NCCL/RCCL/oneCCL-like; shared policy in layers/collectives.py)
    def communicator(self, devices=None, timeout_s: float | None = None): ...
    def report(self) -> dict: ...


class LibraryBase(GemmRoutines, DnnRoutines):
    """Shared library policy; a vendor subclass sets ``vendor``, ``facts`` and ``encoders``.

    GEMM (:mod:`fornax.layers.gemm`) and the DNN routines (:mod:`fornax.layers.dnn`) are
    mixed in over :class:`~fornax.layers.library_core.LibraryCore`."""

    def communicator(self, devices: Sequence[int] | None = None,
                     timeout_s: float | None = None) -> Communicator:
        """A communicator with one rank per device of ``devices`` (default: every device);
        ``timeout_s``: the watchdog's simulated timeout (default: the family's)."""
        return Communicator(self, devices, timeout_s)

    def report(self) -> dict[str, Any]:
        return {"vendor": self.vendor, "name": self.name, "formats": list(self.formats()),
                "shipped": [f"{s['format']}:{s['target']}" for s in self.shipped],
                "algorithms": [{"name": a.name, "tile": list(a.tile), "split_k": a.split_k}
                               for a in self.algorithms],
                "calls": len(self.calls),
                "collectives": [r.to_dict() for r in self.collective_records],
                "workspace_bytes": sum(r.workspace for r in self.calls),
                "algorithms_chosen": [{"routine": r.routine, "shape": list(r.shape),
                                       "algorithm": r.algorithm, "image": r.image, "reason": r.reason,
                                       **({"workspace": r.workspace} if r.workspace else {}),
                                       **({"predictions": r.predictions} if r.predictions else {}),
                                       **({"options": r.options} if r.options else {})}
                                      for r in self.calls]}
