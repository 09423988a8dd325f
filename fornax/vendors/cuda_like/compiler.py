"""cuda-like compiler (nvcc-like): emits PTX-like virtual ISA text, a cubin-like object,
or a fatbin-like bundle of both (cubin-like images for several archs plus PTX-like)."""

from __future__ import annotations

from ...layers.binary import (ContainerError, Encoder, KernelBinary, pack_container, pack_programs,
                              pack_records, unpack_container, unpack_programs, unpack_records)
from ...layers.compiler import CompilerBase
from ...layers.dialect import Dialect
from ...layers.driver import arch_number
from ...sim import isa
from .facts import FACTS

CUBIN_MAGIC = b"\x7fELF"
FATBIN_MAGIC = (0xBA55ED50).to_bytes(4, "little")
#: the PTX-like dialect ([compiler.dialect] in vendor.toml), printed and read by layers/dialect.py
DIALECT = Dialect.from_facts(FACTS["compiler"])


def ptx_image(programs: list[isa.Program], arch: str, producer: str) -> KernelBinary:
    """PTX-like text for the virtual arch ``compute_XY`` (any sm_XY or compute_XY names XY)."""
    virtual = f"compute_{arch_number(arch)}"
    text = DIALECT.render_module(programs, {"target": virtual})
    return KernelBinary("ptx-like", virtual, tuple(p.name for p in programs), text.encode(), producer)


def ptx_kernels(text: str) -> dict[str, isa.Program]:
    """The JIT: PTX-like text -> verified machine programs by name."""
    _, programs = DIALECT.parse_module(text)
    return {p.name: p for p in programs}


def cubin_image(programs: list[isa.Program], arch: str, producer: str) -> KernelBinary:
    """A cubin-like object: machine code for exactly ``sm_XY``."""
    sm = f"sm_{arch_number(arch)}"
    data = pack_programs(CUBIN_MAGIC, {"kind": "cubin-like", "arch": sm}, programs)
    return KernelBinary("cubin-like", sm, tuple(p.name for p in programs), data, producer)


def fatbin_image(programs: list[isa.Program], arch: str, producer: str,
                 cubins: list[str] | None = None, ptx: str | None = None) -> KernelBinary:
    """A fatbin-like bundle: cubin-like images for ``cubins`` (default: the compiler's
    ``fatbin_archs`` plus ``arch``) and PTX-like for ``ptx`` (default: the oldest of them),
    so the driver runs the exact image where there is one and JIT-compiles the PTX on newer
    archs.  ``ptx=""`` leaves the PTX out."""
    sm = f"sm_{arch_number(arch)}"
    archs = cubins if cubins is not None else sorted({*FACTS["compiler"]["fatbin_archs"], sm},
                                                      key=lambda a: arch_number(a) or 0)
    images = [cubin_image(programs, a, producer) for a in archs]
    if ptx is None:
        ptx = archs[0] if archs else sm
    if ptx:
        images.append(ptx_image(programs, ptx, producer))
    header = {"kind": "fatbin-like",
              "entries": [{"format": i.format, "target": i.target} for i in images]}
    data = pack_container(FATBIN_MAGIC, header, pack_records([i.data for i in images]))
    return KernelBinary("fatbin-like", sm, tuple(p.name for p in programs), data, producer)


def unpack_fatbin(binary: KernelBinary) -> list[KernelBinary]:
    """The images inside a fatbin-like bundle, in bundle order."""
    header, payload = unpack_container(FATBIN_MAGIC, binary.data)
    entries, records = header.get("entries"), unpack_records(payload)
    if not isinstance(entries, list) or len(entries) != len(records):
        raise ContainerError("fatbin-like entry table does not match its images")
    return [KernelBinary(str(e.get("format")), str(e.get("target")), binary.entry_points, r,
                         binary.producer) for e, r in zip(entries, records)]


ENCODERS: dict[str, Encoder] = {"ptx-like": ptx_image, "cubin-like": cubin_image, "fatbin-like": fatbin_image}


def disassemble(binary: KernelBinary) -> str:
    """The PTX-like text of a cuda-like image: the PTX itself, or a cubin's kernels with its
    ``sm_XY`` as the target; a fat bundle lists each image in turn."""
    if binary.format == "ptx-like":
        return binary.data.decode()
    if binary.format == "fatbin-like":
        return "".join(f"{DIALECT.comment} {i.format} {i.target}\n{disassemble(i)}"
                       for i in unpack_fatbin(binary))
    header, kernels = unpack_programs(CUBIN_MAGIC, binary.data)
    return DIALECT.render_module(list(kernels.values()), {"target": header.get("arch", binary.target)})


def assemble(text: str, fmt: str = "ptx-like", producer: str = "") -> KernelBinary:
    """Inverse of :func:`disassemble` for ``ptx-like`` and ``cubin-like``."""
    fields, programs = DIALECT.parse_module(text)
    if fmt == "ptx-like":
        return ptx_image(programs, fields["target"], producer)
    if fmt == "cubin-like":
        return cubin_image(programs, fields["target"], producer)
    raise ValueError(f"cuda-like text assembles into ptx-like or cubin-like, not {fmt}")


class CudaLikeCompiler(CompilerBase):
    vendor = FACTS["name"]
    facts = FACTS
    encoders = ENCODERS
    dialect = DIALECT
    disassembler = staticmethod(disassemble)
