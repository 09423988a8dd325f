"""rocm-like compiler (hipcc-like): emits an HSACO-like code object for one exact gfx target."""

from __future__ import annotations

from ...layers.binary import Encoder, KernelBinary, pack_programs, unpack_programs
from ...layers.compiler import CompilerBase
from ...layers.dialect import Dialect
from ...sim import isa
from .facts import FACTS

HSACO_MAGIC = b"\x7fELF"


def triple(target: str) -> str:
    """The full target id, as ``amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-``."""
    return f"amdgcn-amd-amdhsa--{target}{FACTS['driver']['arch_features'].get(target, '')}"


def hsaco_image(programs: list[isa.Program], target: str, producer: str) -> KernelBinary:
    header = {"kind": "hsaco-like", "target": triple(target),
              "code_object_version": FACTS["compiler"]["code_object_version"]}
    data = pack_programs(HSACO_MAGIC, header, programs)
    return KernelBinary("hsaco-like", target, tuple(p.name for p in programs), data, producer)


ENCODERS: dict[str, Encoder] = {"hsaco-like": hsaco_image}
#: the AMDGCN-like listing ([compiler.dialect] in vendor.toml), printed and read by layers/dialect.py
DIALECT = Dialect.from_facts(FACTS["compiler"])
_TRIPLE_PREFIX = "amdgcn-amd-amdhsa--"


def disassemble(binary: KernelBinary) -> str:
    """The AMDGCN-like listing of an hsaco-like code object (its full target id in the prelude)."""
    header, kernels = unpack_programs(HSACO_MAGIC, binary.data)
    return DIALECT.render_module(list(kernels.values()), {"target": header.get("target", "")})


def assemble(text: str, fmt: str = "hsaco-like", producer: str = "") -> KernelBinary:
    """Inverse of :func:`disassemble`: the listing back into an hsaco-like code object."""
    if fmt != "hsaco-like":
        raise ValueError(f"rocm-like text assembles into hsaco-like, not {fmt}")
    fields, programs = DIALECT.parse_module(text)
    target = fields["target"].removeprefix(_TRIPLE_PREFIX).split(":")[0]
    return hsaco_image(programs, target, producer)


class RocmLikeCompiler(CompilerBase):
    vendor = FACTS["name"]
    facts = FACTS
    encoders = ENCODERS
    dialect = DIALECT
    disassembler = staticmethod(disassemble)
