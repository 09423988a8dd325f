"""rocm-like compiler (hipcc-like): emits an HSACO-like code object for one exact gfx target."""

from __future__ import annotations

from ...layers.binary import KernelBinary, pack_programs
from ...layers.compiler import CompilerBase
from ...sim import isa
from . import FACTS

HSACO_MAGIC = b"\x7fELF"


def triple(target: str) -> str:
    """The full target id, as ``amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-``."""
    return f"amdgcn-amd-amdhsa--{target}{FACTS['driver']['arch_features'].get(target, '')}"


def hsaco_image(programs: list[isa.Program], target: str, producer: str) -> KernelBinary:
    header = {"kind": "hsaco-like", "target": triple(target),
              "code_object_version": FACTS["compiler"]["code_object_version"]}
    data = pack_programs(HSACO_MAGIC, header, programs)
    return KernelBinary("hsaco-like", target, tuple(p.name for p in programs), data, producer)


ENCODERS = {"hsaco-like": hsaco_image}


class RocmLikeCompiler(CompilerBase):
    vendor = "rocm-like"
    facts = FACTS
    encoders = ENCODERS
