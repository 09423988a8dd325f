"""fornax's one error hierarchy.

Every failure a user can cause is a :class:`FornaxError` whose message says
what was wrong, where (seam, vendor, op, address) and what to do.  Vendor
families keep their exact error names and numbers (``CUDA_ERROR_ILLEGAL_ADDRESS``
= 700, ``ZE_RESULT_ERROR_DEVICE_LOST`` = 0x70000001, ...) in their own tables;
at the seam a vendor code becomes one of the classes below, with the code
attached as :class:`VendorCode`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VendorCode:
    """A vendor's exact error: its API family, its name and its number."""

    api: str            # "CUresult", "hipError_t", "ze_result_t", ...
    name: str
    value: int
    hex: bool = False   # printed in hex by its family (ze_result_t)

    def __str__(self) -> str:
        num = f"{self.value:#x}" if self.hex else str(self.value)
        return f"{self.name} ({num})"


class FornaxError(Exception):
    """Base of every error fornax raises on purpose."""

    kind = "error"
    #: the JIT / IL build log a failed module build carries (empty for every other error)
    build_log: str = ""

    def __init__(self, message: str, *, seam: str | None = None, vendor: str | None = None,
                 op: str | None = None, hint: str | None = None, code: VendorCode | None = None,
                 address: int | None = None):
        self.message = message
        self.seam = seam
        self.vendor = vendor
        self.op = op
        self.hint = hint
        self.code = code
        self.address = address
        super().__init__(self.render())

    def render(self) -> str:
        where = "/".join(p for p in (self.seam, self.vendor) if p)
        parts = []
        if where:
            parts.append(f"[{where}]")
        if self.op:
            parts.append(f"{self.op}:")
        parts.append(self.message)
        if self.code is not None:
            parts.append(f"[{self.code}]")
        text = " ".join(parts)
        if self.hint:
            text += f" — {self.hint}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "message": self.message,
            "seam": self.seam,
            "vendor": self.vendor,
            "op": self.op,
            "hint": self.hint,
            "code": None if self.code is None else {
                "api": self.code.api, "name": self.code.name, "value": self.code.value},
            "address": self.address,
        }


class ConfigError(FornaxError):
    """A stack config, flag or spec is wrong."""

    kind = "config"


class UnknownVendorError(ConfigError):
    kind = "unknown_vendor"


class UnknownSeamError(ConfigError):
    kind = "unknown_seam"


class FormatMismatchError(ConfigError):
    """Two seams cannot exchange binaries: the producer's formats and the consumer's differ."""

    kind = "format_mismatch"


class GraphError(FornaxError):
    """A graph is malformed (verifier) or an op is used wrongly."""

    kind = "graph"


class CompileError(FornaxError):
    kind = "compile"


class BinaryError(FornaxError):
    """A kernel binary is corrupt, of the wrong format, or has no image for this device."""

    kind = "binary"


class InvalidArgumentError(FornaxError):
    kind = "invalid_argument"


class InvalidHandleError(FornaxError):
    kind = "invalid_handle"


class LaunchError(FornaxError):
    kind = "launch"


class OutOfMemoryError(FornaxError):
    kind = "out_of_memory"


class MemoryFaultError(FornaxError):
    """An illegal address: a page fault on the device."""

    kind = "memory_fault"


class DeviceHangError(FornaxError):
    kind = "hang"


class DeviceLostError(FornaxError):
    kind = "device_lost"


class NotSupportedError(FornaxError):
    kind = "not_supported"


class LibraryError(FornaxError):
    kind = "library"


class UnknownError(FornaxError):
    kind = "unknown"


#: the categories a vendor error table may map its codes onto
CATEGORIES: dict[str, type[FornaxError]] = {
    cls.kind: cls for cls in (
        InvalidArgumentError, InvalidHandleError, OutOfMemoryError, BinaryError, LaunchError,
        MemoryFaultError, DeviceHangError, DeviceLostError, NotSupportedError, ConfigError,
        LibraryError, UnknownError, FornaxError)
}


class ErrorTable:
    """One vendor family's error codes, read from its data table.

    ``codes`` maps the vendor's exact name to ``{"value": int, "category": str}``;
    ``faults`` maps a simulator fault kind (``page_fault``, ``out_of_memory``,
    ``hang``, ...) to the name this family reports it with.
    """

    def __init__(self, api: str, codes: dict[str, dict[str, Any]], faults: dict[str, str], *,
                 seam: str, vendor: str,
                 hex: bool = False):
        self.api = api
        self.seam = seam
        self.vendor = vendor
        self.hex = hex
        self.codes: dict[str, tuple[int, type[FornaxError]]] = {}
        for name, entry in codes.items():
            category = entry.get("category", "unknown")
            if category not in CATEGORIES:
                raise ConfigError(f"error table {api}: {name} has unknown category {category!r}",
                                  seam=seam, vendor=vendor)
            self.codes[name] = (int(entry["value"]), CATEGORIES[category])
        for kind, name in faults.items():
            if name not in self.codes:
                raise ConfigError(f"error table {api}: fault {kind!r} maps to unknown code {name}",
                                  seam=seam, vendor=vendor)
        self.faults = dict(faults)

    def code(self, name: str) -> VendorCode:
        value, _ = self.codes[name]
        return VendorCode(self.api, name, value, self.hex)

    def by_value(self, value: int) -> VendorCode:
        for name, (v, _) in self.codes.items():
            if v == value:
                return VendorCode(self.api, name, v, self.hex)
        raise KeyError(value)

    def error(self, name: str, message: str, *, op: str | None = None, hint: str | None = None,
              address: int | None = None, seam: str | None = None) -> FornaxError:
        """The fornax error for vendor code ``name``."""
        _, cls = self.codes[name]
        return cls(message, seam=seam or self.seam, vendor=self.vendor, op=op, hint=hint,
                   code=self.code(name), address=address)

    def from_fault(self, fault: Exception, *, op: str | None = None, hint: str | None = None,
                   seam: str | None = None) -> FornaxError:
        """Map a simulator fault onto this family's code and fornax's hierarchy."""
        kind = getattr(fault, "kind", "unknown")
        name = self.faults.get(kind) or self.faults["unknown"]
        return self.error(name, str(fault), op=op, hint=hint,
                          address=getattr(fault, "address", None), seam=seam)
