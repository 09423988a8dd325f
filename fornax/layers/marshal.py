"""Library marshalling: one family's library API over another family's library.

Real stacks let a library of one vendor run on another vendor's GPU by forwarding its calls
to the native library there: hipBLAS "marshals" to cuBLAS on NVIDIA, oneMath (the oneMKL
interfaces) selects a cuBLAS or rocBLAS backend at run time, ZLUDA provides cuBLAS over
rocBLAS, chipStar hipBLAS over oneMKL.  A family declares what its library can forward to as
data, in its ``vendor.toml``::

    [[portability.library]]          # drivers of other families this library runs on
    backend = "cuda-like"            # the driver family whose own library does the work
    name = "hipblas-marshal-like"
    real_name = "hipBLAS on NVIDIA: marshalling to cuBLAS"
    per_call_s = 1.0e-6              # simulated host overhead of one forwarded call
    basis = "modelling assumption"   # or "vendor figure", "published measurement"

Several entries may name one backend (ZLUDA's cuBLAS and a HIPIFY port both reach rocBLAS);
the first is the default and ``--path NAME`` picks another.

A :class:`MarshallingLibrary` is the composed library: the API and name of the family the
user chose, the routines, kernels, algorithm choices and shipped images of the backend (the
stack builds the backend from the driver's family at compose time; this module imports no
vendor).  Each forwarded call is counted and its overhead is spent on the simulated host
clock of the call's device before the backend launches (the stack hands in how), so a
launch-bound workload shows it in device time and a compute-bound one hides it behind the
queue, as a real host-side layer does; the report shows the sum apart.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .call_record import CallRecord
from .collectives import Communicator
from .errors import ConfigError
from .library import Library
from .portability import declared_basis, declared_tables

_KEYS = {"backend", "name", "real_name", "per_call_s", "basis", "why"}
#: spends simulated host time for one call on ``stream`` (None: the current device's default)
HostCharge = Callable[[Any, float], None]


@dataclass(frozen=True)
class MarshalPath:
    """One declared forwarding: ``front``'s library API over ``backend``'s library."""

    name: str
    front: str          # the family whose library API the user composed
    backend: str        # the driver's family, whose library does the work
    real_name: str
    per_call_s: float = 0.0
    basis: str = ""


def marshal_paths(facts: dict[str, Any], vendor: str) -> list[MarshalPath]:
    """The ``[[portability.library]]`` a family declares, checked key by key."""
    portability = facts.get("portability", {})
    raw = portability.get("library", []) if isinstance(portability, dict) else []
    out = []
    for i, t in enumerate(declared_tables(raw, vendor, "portability.library", _KEYS)):
        where = f"{vendor} vendor.toml: portability.library[{i}]"
        backend = t.get("backend")
        if not isinstance(backend, str) or not backend:
            raise ConfigError(f"{where}: backend must name a vendor family", vendor=vendor)
        cost = t.get("per_call_s", 0.0)
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost < 0:
            raise ConfigError(f"{where}: per_call_s must be a non-negative number", vendor=vendor)
        out.append(MarshalPath(str(t.get("name", f"{vendor}->{backend}")), vendor, backend,
                               str(t.get("real_name", "")), float(cost), declared_basis(t, where, vendor)))
    return out


def _forwarded(routine: str) -> Callable[..., CallRecord]:
    """A method that counts one forwarded call and runs ``routine`` on the backend library."""
    # where the Library Protocol puts the routine's stream (its last parameter)
    at = list(inspect.signature(getattr(Library, routine)).parameters).index("stream") - 1

    def forward(self: MarshallingLibrary, *args: Any, **kwargs: Any) -> CallRecord:
        self._count(kwargs["stream"] if "stream" in kwargs else args[at] if len(args) > at else None)
        record: CallRecord = getattr(self.backend, routine)(*args, **kwargs)
        return record
    forward.__name__ = forward.__qualname__ = routine
    forward.__doc__ = f"``{routine}`` of the backend library, counted as one forwarded call."
    return forward


class MarshallingLibrary:
    """The library seam of ``path.front`` forwarding every routine to ``backend``."""

    def __init__(self, path: MarshalPath, name: str, backend: Library, charge: HostCharge | None = None):
        self.path = path
        self._charge = charge
        self.vendor = path.front
        self.name = name
        self.backend = backend
        self.forwarded = 0
        #: simulated host time the forwarding layer added (calls x per-call overhead)
        self.marshal_s = 0.0

    @property
    def calls(self) -> Sequence[CallRecord]:
        return self.backend.calls

    def formats(self) -> tuple[str, ...]:
        return self.backend.formats()

    def ops(self) -> frozenset[str]:
        return self.backend.ops()

    def _count(self, stream: Any = None) -> None:
        self.forwarded += 1
        self.marshal_s += self.path.per_call_s
        if self._charge is not None and self.path.per_call_s:
            self._charge(stream, self.path.per_call_s)

    gemm = _forwarded("gemm")
    conv2d_fwd = _forwarded("conv2d_fwd")
    conv2d_bwd_data = _forwarded("conv2d_bwd_data")
    conv2d_bwd_weights = _forwarded("conv2d_bwd_weights")
    attention_fwd = _forwarded("attention_fwd")
    attention_bwd = _forwarded("attention_bwd")
    layer_norm_fwd = _forwarded("layer_norm_fwd")
    layer_norm_bwd = _forwarded("layer_norm_bwd")
    rms_norm_fwd = _forwarded("rms_norm_fwd")
    rms_norm_bwd = _forwarded("rms_norm_bwd")
    softmax_fwd = _forwarded("softmax_fwd")
    softmax_bwd = _forwarded("softmax_bwd")
    pool2d_fwd = _forwarded("pool2d_fwd")
    pool2d_bwd = _forwarded("pool2d_bwd")
    paged_cache_write = _forwarded("paged_cache_write")
    paged_attention = _forwarded("paged_attention")
    custom_kernel = _forwarded("custom_kernel")
    sparse_prune = _forwarded("sparse_prune")
    sparse_prune_check = _forwarded("sparse_prune_check")
    sparse_compress = _forwarded("sparse_compress")
    sparse_matmul = _forwarded("sparse_matmul")

    def sparse_info(self) -> dict[str, Any]:
        """The backend's 2:4 facts (hipSPARSELt's cuSPARSELt backend runs cuSPARSELt's calls)."""
        return self.backend.sparse_info()

    def sparse_compressed_size(self, params: dict[str, Any]) -> tuple[int, int]:
        return self.backend.sparse_compressed_size(params)

    def sparse_predict(self, params: dict[str, Any]) -> float:
        return self.backend.sparse_predict(params)

    def communicator(self, devices: Sequence[int] | None = None,
                     timeout_s: float | None = None) -> Communicator:
        return self.backend.communicator(devices, timeout_s)

    def report(self) -> dict[str, Any]:
        rep = dict(self.backend.report())
        rep.update({"vendor": self.vendor, "name": self.name,
                    "marshalling": {"name": self.path.name, "real_name": self.path.real_name,
                                    "backend": self.path.backend, "backend_library": self.backend.name,
                                    "per_call_s": self.path.per_call_s, "basis": self.path.basis,
                                    "calls": self.forwarded,
                                    "simulated_s": self.marshal_s}})
        return rep
