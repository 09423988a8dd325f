"""What every routine of a library shares: facts, runtime, shipped images, the call log.

:class:`LibraryCore` is the base of the routine mixins (:class:`~fornax.layers.gemm.
GemmRoutines`, :class:`~fornax.layers.dnn.DnnRoutines`) that
:class:`~fornax.layers.library.LibraryBase` composes.  It holds the family's
``vendor.toml`` facts, the runtime the library launches on, the list of kernel
images the library ships (``[library] shipped``) and the rule that picks one of
them for a device, the vendor's image encoders, and the log of calls the report
lists.  A vendor subclass sets ``vendor``, ``facts`` and ``encoders``.
"""

from __future__ import annotations

from typing import Any

from ..sim.isa import Program
from .binary import Encoder, KernelBinary, ShippedImage
from .call_record import CallRecord
from .collectives import CollectiveRecord
from .driver import arch_number
from .errors import LibraryError
from .runtime import Runtime

class LibraryCore:
    """The library's shared state and image policy (base of the routine mixins)."""

    seam = "library"
    vendor = "base"
    facts: dict[str, Any] = {}

    #: vendor hook: shipped format -> encoder(programs, target, producer) -> KernelBinary
    encoders: dict[str, Encoder] = {}

    def __init__(self, runtime: Runtime) -> None:
        lib = self.facts["library"]
        self.runtime = runtime
        self.name: str = lib["name"]
        self.shipped: list[ShippedImage] = list(lib["shipped"])
        self.group_size: int = lib["group_size"]
        self.calls: list[CallRecord] = []
        #: every collective of this library's communicators (they append to this list)
        self.collective_records: list[CollectiveRecord] = []

    def build(self, programs: list[Program], fmt: str, target: str) -> KernelBinary:
        """Pack kernels into one shipped image of ``fmt`` for ``target``."""
        return self.encoders[fmt](programs, target, f"{self.vendor} {self.name}")

    def formats(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s["format"] for s in self.shipped))

    def ops(self) -> frozenset[str]:
        return frozenset(self.facts["library"]["ops"])

    def _error(self, message: str, hint: str | None = None) -> LibraryError:
        return LibraryError(message, seam="library", vendor=self.vendor, op=self.name, hint=hint)

    def _image_for(self, target: str, loadable: tuple[str, ...]) -> ShippedImage:
        """The shipped image for a device of arch ``target`` whose driver loads ``loadable``:
        an exact match first, then a virtual ISA of this arch or older, then an IL; none is a
        :class:`~fornax.layers.errors.LibraryError` listing what was shipped."""
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
