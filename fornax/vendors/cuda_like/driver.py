"""cuda-like driver: CUresult codes, thread-current contexts, streams; loads PTX-like (JIT),
cubin-like (exact sm) and fatbin-like bundles of both."""

from __future__ import annotations

from ...layers.binary import ContainerError, KernelBinary, unpack_programs
from ...layers.driver import DriverBase, QueueBase
from ...sim import isa
from ...sim.device import Device
from ...sim.timeline import Packet
from .facts import FACTS
from .compiler import CUBIN_MAGIC, ptx_kernels, unpack_fatbin


class Stream(QueueBase):
    """A CUDA stream: work enters its hardware queue in issue order."""

    flavour = "stream"

    def _submit(self, packet: Packet) -> None:
        self.hwq.submit(packet)


class CudaLikeDriver(DriverBase):
    vendor = FACTS["name"]
    facts = FACTS
    queue_class = Stream

    def decode_image(self, binary: KernelBinary) -> dict[str, isa.Program]:
        if binary.format == "ptx-like":
            try:
                text = binary.data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ContainerError(f"ptx-like image is not UTF-8 text (byte {exc.start})") from None
            return ptx_kernels(text)                    # the JIT: PTX-like text -> programs
        header, kernels = unpack_programs(CUBIN_MAGIC, binary.data)
        if header.get("arch") != binary.target:
            raise ContainerError(f"cubin-like header says {header.get('arch')}, tag says {binary.target}")
        return kernels

    def unbundle(self, binary: KernelBinary) -> list[KernelBinary]:
        return unpack_fatbin(binary)

    def native_properties(self, device: Device, target: str) -> dict:
        cc = target.removeprefix("sm_")
        s = device.spec
        return {"name": f"fornax {s.name} ({target})", "major": int(cc[:-1]), "minor": int(cc[-1]),
                "multiProcessorCount": s.compute_units, "warpSize": FACTS["driver"]["simd_width"],
                "totalGlobalMem": s.hbm_bytes, "maxThreadsPerBlock": s.max_group_size,
                "sharedMemPerMultiprocessor": s.shared_memory_per_unit,
                "clockRate": int(s.clock_ghz * 1e6), "l2CacheSize": s.l2_bytes}
