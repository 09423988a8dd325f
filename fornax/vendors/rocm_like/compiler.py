"""rocm-like compiler (hipcc-like): emits an HSACO-like code object for one exact gfx target."""

from __future__ import annotations

from ...layers.binary import KernelBinary, pack_container, pack_records
from ...layers.compiler import CompilerBase, Target
from ...sim import isa
from . import FACTS

HSACO_MAGIC = b"\x7fELF"


def triple(target: str) -> str:
    """The full target id, as ``amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-``."""
    return f"amdgcn-amd-amdhsa--{target}{FACTS['driver']['arch_features'].get(target, '')}"


def hsaco_image(programs: list[isa.Program], target: str, producer: str) -> KernelBinary:
    header = {"kind": "hsaco-like", "target": triple(target),
              "code_object_version": FACTS["compiler"]["code_object_version"]}
    data = pack_container(HSACO_MAGIC, header, pack_records([isa.encode(p) for p in programs]))
    return KernelBinary("hsaco-like", target, tuple(p.name for p in programs), data, producer)


class RocmLikeCompiler(CompilerBase):
    vendor = "rocm-like"
    facts = FACTS

    def emit(self, programs: list[isa.Program], target: Target) -> KernelBinary:
        return hsaco_image(programs, target.arch, f"{self.vendor} {FACTS['compiler']['name']}")
