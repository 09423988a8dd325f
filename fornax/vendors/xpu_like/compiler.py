"""xpu-like compiler (DPC++-like): emits SPIR-V-like IL (built by the driver at load) or a native zebin-like."""

from __future__ import annotations

from ...layers.binary import Encoder, KernelBinary, pack_programs, unpack_programs
from ...layers.compiler import CompilerBase
from ...layers.dialect import Dialect
from ...sim import isa
from .facts import FACTS

SPIRV_MAGIC = (0x07230203).to_bytes(4, "little")
ZEBIN_MAGIC = b"\x7fELF"
IL_TARGET = "spirv64"


def spirv_image(programs: list[isa.Program], target: str, producer: str) -> KernelBinary:
    header = {"kind": "spirv-like", "version": FACTS["compiler"]["spirv_version"],
              "addressing": "Physical64", "entry_points": [p.name for p in programs]}
    data = pack_programs(SPIRV_MAGIC, header, programs)
    return KernelBinary("spirv-like", IL_TARGET, tuple(p.name for p in programs), data, producer)


def zebin_image(programs: list[isa.Program], target: str, producer: str) -> KernelBinary:
    header = {"kind": "zebin-like", "device": target,
              "device_id": FACTS["driver"]["device_ids"].get(target, "")}
    data = pack_programs(ZEBIN_MAGIC, header, programs)
    return KernelBinary("zebin-like", target, tuple(p.name for p in programs), data, producer)


ENCODERS: dict[str, Encoder] = {"spirv-like": spirv_image, "zebin-like": zebin_image}
#: the SPIR-V-like disassembly ([compiler.dialect] in vendor.toml), printed and read by layers/dialect.py
DIALECT = Dialect.from_facts(FACTS["compiler"])


def disassemble(binary: KernelBinary) -> str:
    """The SPIR-V-like text of a spirv-like module (target ``spirv64``) or a zebin-like object
    (target: its device)."""
    magic = SPIRV_MAGIC if binary.format == "spirv-like" else ZEBIN_MAGIC
    header, kernels = unpack_programs(magic, binary.data)
    target = IL_TARGET if binary.format == "spirv-like" else header.get("device", binary.target)
    return DIALECT.render_module(list(kernels.values()), {"target": target})


def assemble(text: str, fmt: str = "spirv-like", producer: str = "") -> KernelBinary:
    """Inverse of :func:`disassemble`: the text back into a spirv-like or zebin-like binary."""
    if fmt not in ENCODERS:
        raise ValueError(f"xpu-like text assembles into {' or '.join(ENCODERS)}, not {fmt}")
    fields, programs = DIALECT.parse_module(text)
    return ENCODERS[fmt](programs, fields["target"], producer)


class XpuLikeCompiler(CompilerBase):
    vendor = FACTS["name"]
    facts = FACTS
    encoders = ENCODERS
    dialect = DIALECT
    disassembler = staticmethod(disassemble)
