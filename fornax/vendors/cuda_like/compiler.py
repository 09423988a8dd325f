"""cuda-like compiler (nvcc-like): emits PTX-like virtual ISA text or a cubin-like object."""

from __future__ import annotations

from ...layers.binary import KernelBinary, pack_programs
from ...layers.compiler import CompilerBase
from ...layers.driver import arch_number
from ...sim import isa
from . import FACTS

CUBIN_MAGIC = b"\x7fELF"


def ptx_image(programs: list[isa.Program], arch: str, producer: str) -> KernelBinary:
    """PTX-like text for the virtual arch ``compute_XY`` (any sm_XY or compute_XY names XY)."""
    virtual = f"compute_{arch_number(arch)}"
    head = [f".version {FACTS['compiler']['ptx_version']}", f".target {virtual}", ".address_size 64", ""]
    text = "\n".join(head) + "\n".join(isa.disassemble(p) for p in programs)
    return KernelBinary("ptx-like", virtual, tuple(p.name for p in programs), text.encode(), producer)


def cubin_image(programs: list[isa.Program], arch: str, producer: str) -> KernelBinary:
    """A cubin-like object: machine code for exactly ``sm_XY``."""
    sm = f"sm_{arch_number(arch)}"
    data = pack_programs(CUBIN_MAGIC, {"kind": "cubin-like", "arch": sm}, programs)
    return KernelBinary("cubin-like", sm, tuple(p.name for p in programs), data, producer)


ENCODERS = {"ptx-like": ptx_image, "cubin-like": cubin_image}


class CudaLikeCompiler(CompilerBase):
    vendor = "cuda-like"
    facts = FACTS
    encoders = ENCODERS
