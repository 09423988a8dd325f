"""xpu-like compiler (DPC++-like): emits SPIR-V-like IL (built by the driver at load) or a native zebin-like."""

from __future__ import annotations

from ...layers.binary import KernelBinary, pack_programs
from ...layers.compiler import CompilerBase
from ...sim import isa
from . import FACTS

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


ENCODERS = {"spirv-like": spirv_image, "zebin-like": zebin_image}


class XpuLikeCompiler(CompilerBase):
    vendor = "xpu-like"
    facts = FACTS
    encoders = ENCODERS
