"""Cross-family binary translation: one family's kernels made loadable by another's driver.

Real stacks run one vendor's binaries on another's GPUs by translating them
(a ZLUDA-like PTX -> native ISA path, a chipStar-like SPIR-V path).  Here a
translation path is **data**: the family whose driver accepts translated
binaries declares it in its ``vendor.toml``::

    [[translators]]                 # binaries this family's driver takes after translation
    name = "ptx2spirv-like"
    from = "ptx-like"               # a format another family's compiler emits
    to = "spirv-like"               # a format this family's driver loads
    cost_s = 5.0e-3                 # simulated fixed cost per translated module
    cost_s_per_kib = 0.5e-3         # simulated cost per KiB of source binary

A :class:`Translator` decodes the source container into tile-ISA programs
with the *source* family's decoder and re-encodes them with the
*destination* family's encoder.  This module imports no vendor: the codecs
are handed in (the stack wires them at compose time), and
:class:`TranslatingCompiler` puts the translator between a compiler's output
and the driver's load, counting translations, bytes and simulated cost.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from ..sim.faults import InvalidProgram
from ..sim.isa import Program
from .binary import ContainerError, Encoder, KernelBinary
from .compiler import CompiledGraph, CompileOptions, Compiler, ProgramEmitter, Target
from .errors import BinaryError, CompileError, ConfigError, FornaxError
from .graph import Graph
from .portability import declared_basis, declared_tables

#: decoder: a source-format binary -> its kernels by name (raises ContainerError/InvalidProgram)
Decoder = Callable[[KernelBinary], dict[str, Program]]
#: encoder: (programs, target, producer) -> a destination-format binary

_PATH_KEYS = {"name", "from", "to", "cost_s", "cost_s_per_kib", "real_name", "basis", "why"}
#: how a path moves kernels across families: the compiler's own cross-target output (declared by
#: the compiler's family, ``[[portability.compiler]]``: compiled for the foreign target at
#: compile time, no module-load cost), a translator at module load (declared by the driver's
#: family, ``[[translators]]``), or a port: the source migrated by a tool a user runs
#: deliberately (``[[portability.compiler]]`` with ``mechanism = "port"``, chosen only with
#: ``--path``).  Negotiation tries them in this order.
MECHANISMS = ("cross-compile", "translate", "port")


@dataclass(frozen=True)
class TranslationPath:
    """One declared translation: ``from_format`` -> ``to_format``, offered by ``vendor``."""

    name: str
    from_format: str
    to_format: str
    vendor: str                    # the family that declared it
    cost_s: float = 0.0
    cost_s_per_kib: float = 0.0
    mechanism: str = "translate"   # one of MECHANISMS
    real_name: str = ""            # what the path is called in the real world
    basis: str = ""                # one of portability.BASES when the path declares a cost

    def cost(self, nbytes: int) -> float:
        """Simulated translation time for a source binary of ``nbytes``."""
        return self.cost_s + self.cost_s_per_kib * nbytes / 1024


def translation_paths(facts: dict[str, Any], vendor: str) -> list[TranslationPath]:
    """The ``[[translators]]`` a family declares (its driver loads their ``to`` format after a
    translation at module load), checked key by key."""
    return _paths(facts.get("translators", []), vendor, "translators", "translate")


def cross_compile_paths(facts: dict[str, Any], vendor: str) -> list[TranslationPath]:
    """The ``[[portability.compiler]]`` a family declares: formats of other families' drivers its
    compiler emits (HIP on NVIDIA, SYCL's CUDA and HIP backends, chipStar's SPIR-V)."""
    portability = facts.get("portability", {})
    raw = portability.get("compiler", []) if isinstance(portability, dict) else []
    return _paths(raw, vendor, "portability.compiler", "cross-compile", ("cross-compile", "port"))


def _paths(raw: Any, vendor: str, table: str, mechanism: str,
           mechanisms: tuple[str, ...] = ()) -> list[TranslationPath]:
    out = []
    keys = _PATH_KEYS | ({"mechanism"} if mechanisms else set())
    for i, t in enumerate(declared_tables(raw, vendor, table, keys)):
        where = f"{vendor} vendor.toml: {table}[{i}]"
        how = t.get("mechanism", mechanism)
        if mechanisms and how not in mechanisms:
            raise ConfigError(f"{where}: mechanism must be one of {', '.join(mechanisms)}, got {how!r}",
                              vendor=vendor)
        basis = declared_basis(t, where, vendor)
        for key in ("from", "to"):
            if not isinstance(t.get(key), str) or not t[key]:
                raise ConfigError(f"{where}: {key} must be a format name", vendor=vendor)
        costs = {}
        for key in ("cost_s", "cost_s_per_kib"):
            v = t.get(key, 0.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"{where}: {key} must be a non-negative number, got {v!r}",
                                  vendor=vendor)
            costs[key] = float(v)
        name = t.get("name", f"{t['from']}->{t['to']}")
        out.append(TranslationPath(str(name), t["from"], t["to"], vendor, **costs, mechanism=how,
                                   real_name=str(t.get("real_name", "")), basis=basis))
    return out


def candidate_paths(compiler_facts: dict[str, Any], compiler_vendor: str, driver_facts: dict[str, Any],
                    driver_vendor: str, emits: tuple[str, ...],
                    loadable: tuple[str, ...]) -> list[TranslationPath]:
    """Every declared path from a format the compiler emits to one the driver loads, in the
    order negotiation prefers them: the compiler's own cross-target output, then a translator
    the driver's family accepts at module load, then a port; within a mechanism, in the
    compiler's format preference order."""
    declared = cross_compile_paths(compiler_facts, compiler_vendor) + translation_paths(driver_facts,
                                                                                      driver_vendor)
    out = []
    for how in MECHANISMS:
        for fmt in emits:
            out += [p for p in declared if p.mechanism == how and p.from_format == fmt
                    and p.to_format in loadable]
    return out


def lane_efficiency(source_simd: int, target_simd: int) -> float:
    """Lanes doing work when a kernel laid out for ``source_simd``-wide groups runs, unchanged, on
    ``target_simd``-wide hardware: a 32-lane warp on a 64-lane wavefront fills half of it; a wider
    source group splits into whole hardware groups and loses nothing (modelling assumption)."""
    if source_simd <= 0 or target_simd <= 0:
        raise ValueError("SIMD widths must be positive")
    return min(1.0, source_simd / target_simd)


class Translator:
    """Decode a ``from_format`` binary and re-encode its kernels as ``to_format``."""

    def __init__(self, path: TranslationPath, decode: Decoder, encode: Encoder, lanes: float = 1.0):
        self.path = path
        self.decode = decode
        self.encode = encode
        #: what a translated kernel keeps of its source: its group layout, so on wider hardware
        #: only this fraction of the lanes works (:func:`lane_efficiency`; 1.0 for a
        #: cross-compile or a port, which compile for the target)
        self.lanes = lanes if path.mechanism == "translate" else 1.0
        self._done: dict[tuple[str, str], KernelBinary] = {}
        self.counts = {"translations": 0, "reused": 0, "bytes_in": 0, "bytes_out": 0, "kernels": 0}
        self.simulated_s = 0.0

    @property
    def from_format(self) -> str:
        return self.path.from_format

    @property
    def to_format(self) -> str:
        return self.path.to_format

    def _error(self, message: str, hint: str | None = None) -> BinaryError:
        return BinaryError(message, seam="compiler", vendor=self.path.vendor,
                           op=f"translate {self.from_format} -> {self.to_format}", hint=hint)

    def translate(self, binary: KernelBinary, target: str) -> KernelBinary:
        """The kernels of ``binary`` as a ``to_format`` binary for ``target``.

        A binary translated before (same digest, same target) is reused, as a
        translation cache would; only new translations count and cost."""
        if not isinstance(binary, KernelBinary):
            raise self._error(f"expected a KernelBinary, got {type(binary).__name__}")
        if binary.format != self.from_format:
            raise self._error(f"cannot translate a {binary.format} binary; this path takes "
                              f"{self.from_format}", hint="compose a compiler that emits "
                              f"{self.from_format}")
        key = (binary.digest, target)
        if key in self._done:
            self.counts["reused"] += 1
            return self._done[key]
        try:
            kernels = self.decode(binary)
        except (ContainerError, InvalidProgram, UnicodeDecodeError, ValueError) as exc:
            raise self._error(f"{binary.format} binary for {binary.target} cannot be decoded: {exc}",
                              hint="the binary is corrupt or was not produced for this format") from None
        missing = [e for e in binary.entry_points if e not in kernels]
        if missing:
            raise self._error(f"{binary.format} binary names entry point(s) {', '.join(missing)} "
                              "that it does not define")
        order = list(binary.entry_points) + [n for n in kernels if n not in binary.entry_points]
        producer = f"{binary.producer} via {self.path.name}" if binary.producer else self.path.name
        programs = [kernels[n] for n in order]
        if self.lanes < 1.0:        # the cost model reads it: vector work on the lanes that work
            programs = [dataclasses.replace(p, meta={**p.meta, "lane_efficiency": self.lanes})
                        for p in programs]
        try:
            out = self.encode(programs, target, producer)
        except FornaxError:
            raise
        except (ContainerError, InvalidProgram, ValueError, KeyError) as exc:
            raise self._error(f"cannot encode the kernels as {self.to_format} for {target}: {exc}") from None
        if out.format != self.to_format:
            raise self._error(f"the {self.to_format} encoder produced a {out.format} binary")
        cost = self.path.cost(len(binary.data))
        out = dataclasses.replace(out, metadata={**out.metadata, "translated_from":
                                                 f"{binary.format}:{binary.target}",
                                                 "translator": self.path.name,
                                                 "translate_s": cost})
        self.counts["translations"] += 1
        self.counts["bytes_in"] += len(binary.data)
        self.counts["bytes_out"] += len(out.data)
        self.counts["kernels"] += len(order)
        self.simulated_s += cost
        self._done[key] = out
        return out

    def report(self) -> dict[str, Any]:
        p = self.path
        return {"name": p.name, "from": p.from_format, "to": p.to_format, "declared_by": p.vendor,
                "mechanism": p.mechanism, "real_name": p.real_name, "basis": p.basis,
                "cost_s": p.cost_s, "cost_s_per_kib": p.cost_s_per_kib, "lane_efficiency": self.lanes,
                **self.counts,
                "simulated_s": self.simulated_s}


class TranslatingCompiler:
    """A compiler whose output goes through a :class:`Translator` before the driver sees it.

    It compiles for ``source_arch`` in the translator's source format (what
    the inner compiler can emit) and hands back plans whose binary is in the
    destination format for the device the driver names.  Everything else
    (counters, cache, options) is the inner compiler's."""

    def __init__(self, inner: Compiler, translator: Translator, source_arch: str):
        self.inner = inner
        self.translator = translator
        self.source_arch = source_arch

    def __getattr__(self, name: str) -> Any:
        # whatever else the inner compiler offers (cache, options, counters) is its own
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def vendor(self) -> str:
        return self.inner.vendor

    @property
    def compile_wall_s(self) -> float:
        return self.inner.compile_wall_s

    def unsupported(self, graph: Graph,
                    library_routines: frozenset[str] = frozenset()) -> dict[str, str]:
        return self.inner.unsupported(graph, library_routines)

    def output_formats(self) -> tuple[str, ...]:
        return (self.translator.to_format,)

    def source_target(self, target: Target) -> Target:
        return Target(self.source_arch, self.translator.from_format, target.compute_units)

    def _check_format(self, target: Target) -> None:
        if target.format != self.translator.to_format:
            raise CompileError(f"this {self.inner.vendor} compiler reaches the driver through "
                               f"{self.translator.path.name} and emits {self.translator.to_format} only, "
                               f"not {target.format}", seam="compiler", vendor=self.inner.vendor,
                               hint=f"ask for {self.translator.to_format}")

    def emit(self, programs: list[Program], target: Target) -> KernelBinary:
        """``programs`` packed in the source format for the source arch, then carried across by
        the path, as a compiled plan's binary is (what the driver suite loads)."""
        self._check_format(target)
        if not isinstance(self.inner, ProgramEmitter):
            raise CompileError(f"the {self.inner.vendor} compiler cannot pack hand-written programs",
                               seam="compiler", vendor=self.inner.vendor)
        src = self.inner.emit(programs, self.source_target(target))
        return self.translator.translate(src, target.arch)

    def compile(self, graph: Graph, target: Target, library_routines: frozenset[str] = frozenset(),
                options: CompileOptions | None = None) -> CompiledGraph:
        self._check_format(target)
        plan = self.inner.compile(graph, self.source_target(target), library_routines, options)
        if plan.binary is None:
            return plan
        src = plan.binary
        binary = self.translator.translate(src, target.arch)
        return dataclasses.replace(plan, target=target, binary=binary, log=list(plan.log) + [
            f"translate: {src.format}:{src.target} -> {binary.format}:{binary.target} by "
            f"{self.translator.path.name} ({len(src.data)} -> {len(binary.data)} bytes)"])

    def report(self) -> dict[str, Any]:
        rep = dict(self.inner.report())
        rep["translator"] = self.translator.report()
        return rep
