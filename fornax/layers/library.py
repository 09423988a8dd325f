"""The library seam: named library routines (BLAS-like GEMM for the foundation).

A library sits on the runtime seam, like cuBLAS on the CUDA runtime.  It
ships its kernels as binaries in its family's format for a list of targets
(``vendor.toml`` ``[library]``); on a device outside that list it fails the
way real libraries do, unless one of its images is a virtual ISA the driver
can JIT for the device.  Each call picks an algorithm (a tile
configuration) by a heuristic over shape and compute units, and says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..sim.isa import Program
from . import codegen
from .binary import KernelBinary
from .driver import arch_number
from .errors import LibraryError
from .graph import DType
from .runtime import Runtime, Stream
from .tiling import choose_gemm_tile


@dataclass(frozen=True)
class Algorithm:
    name: str
    tile: tuple[int, int, int]


@dataclass
class CallRecord:
    routine: str
    algorithm: str
    reason: str
    image: str                     # "format:target" of the kernel image used
    shape: tuple


@runtime_checkable
class Library(Protocol):
    vendor: str
    name: str

    def formats(self) -> tuple[str, ...]: ...
    def ops(self) -> frozenset: ...
    def gemm(self, a: int, b: int, c: int, params: dict, stream: Stream | None = None) -> CallRecord: ...
    def report(self) -> dict: ...


class LibraryBase:
    """Shared library policy; a vendor subclass sets ``vendor``, ``facts`` and ``encoders``."""

    seam = "library"
    vendor = "base"
    facts: dict = {}

    #: vendor hook: shipped format -> encoder(programs, target, producer) -> KernelBinary
    encoders: dict = {}

    def build(self, programs: list[Program], fmt: str, target: str) -> KernelBinary:
        """Pack kernels into one shipped image of ``fmt`` for ``target``."""
        return self.encoders[fmt](programs, target, f"{self.vendor} {self.name}")

    # -- shared ------------------------------------------------------------------------
    def __init__(self, runtime: Runtime):
        lib = self.facts["library"]
        self.runtime = runtime
        self.name: str = lib["name"]
        self.shipped: list[dict] = list(lib["shipped"])
        self.algorithms = [Algorithm(a["name"], tuple(a["tile"])) for a in lib["gemm_algorithms"]]
        self.dtypes = frozenset(lib["gemm_dtypes"])
        self.group_size = lib["group_size"]
        self._images: dict[tuple, KernelBinary] = {}
        self.calls: list[CallRecord] = []

    def formats(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s["format"] for s in self.shipped))

    def ops(self) -> frozenset:
        return frozenset(self.facts["library"]["ops"])

    def _error(self, message: str, hint: str | None = None) -> LibraryError:
        return LibraryError(message, seam="library", vendor=self.vendor, op=self.name, hint=hint)

    def choose(self, m: int, n: int, batch: int) -> tuple[Algorithm, str]:
        """The family's algorithm list through the shared tile heuristic (layers/tiling.py)."""
        units = self.runtime.driver.properties(self.runtime.current_device()).compute_units
        i, why = choose_gemm_tile(m, n, batch, units, [a.tile for a in self.algorithms])
        return self.algorithms[i], why

    def _image_for(self, target: str, loadable: tuple[str, ...]) -> dict:
        candidates = [s for s in self.shipped if s["format"] in loadable]
        for s in candidates:
            if s.get("rule") == "exact" and s["target"] == target:
                return s
        have = arch_number(target)
        for s in candidates:
            need = arch_number(s["target"])
            if s.get("rule") == "virtual" and have is not None and need is not None and need <= have:
                return s
        for s in candidates:
            if s.get("rule") == "il":
                return s
        shipped = ", ".join(f"{s['format']}:{s['target']}" for s in self.shipped)
        raise self._error(f"no kernel image for {target} (shipped: {shipped})",
                          hint="use a device this library was built for, or a library build "
                               "that includes this arch")

    def _module(self, algo: Algorithm, dtype: DType):
        dev = self.runtime.current_device()
        props = self.runtime.driver.properties(dev)
        image = self._image_for(props.target, self.runtime.driver.loadable_formats(dev))
        key = (algo.name, dtype, image["format"], image["target"])
        if key not in self._images:
            programs = []
            for b_batched in (False, True):
                name = f"{self.name}_gemm_{dtype.value}_{algo.name}{'_bb' if b_batched else ''}"
                program, _ = codegen.gemm_kernel(name, dtype, "m", "n", "k", 1, b_batched,
                                                 algo.tile, self.group_size)
                programs.append(program)
            self._images[key] = self.build(programs, image["format"], image["target"])
        return self.runtime.load_module(self._images[key]), image

    def gemm(self, a: int, b: int, c: int, params: dict, stream: Stream | None = None) -> CallRecord:
        m, n, k, batch = params["m"], params["n"], params["k"], params.get("batch", 1)
        dtype = DType.of(params["dtype"])
        if dtype.value not in self.dtypes:
            raise self._error(f"gemm does not support {dtype} (supports {', '.join(sorted(self.dtypes))})")
        if min(m, n, k, batch) <= 0:
            raise self._error(f"gemm sizes must be positive, got m={m} n={n} k={k} batch={batch}")
        algo, reason = self.choose(m, n, batch)
        module, image = self._module(algo, dtype)
        entry = f"{self.name}_gemm_{dtype.value}_{algo.name}{'_bb' if params.get('b_batched') else ''}"
        bm, bn, _ = algo.tile
        grid = (math.ceil(n / bn), math.ceil(m / bm), batch)
        self.runtime.launch(module, entry, grid, {"a": a, "b": b, "c": c, "m": m, "n": n, "k": k},
                            stream)
        record = CallRecord("gemm", algo.name, reason, f"{image['format']}:{image['target']}",
                            (batch, m, n, k))
        self.calls.append(record)
        return record

    def report(self) -> dict:
        return {"vendor": self.vendor, "name": self.name, "formats": list(self.formats()),
                "shipped": [f"{s['format']}:{s['target']}" for s in self.shipped],
                "calls": len(self.calls),
                "algorithms_chosen": [{"routine": r.routine, "shape": list(r.shape),
                                       "algorithm": r.algorithm, "image": r.image, "reason": r.reason}
                                      for r in self.calls]}
