"""What the plugin's handles point to: the client, its devices and memories, buffers and
executables, each over fornax's JAX client (:mod:`..pjrt`), which holds buffers in
simulated device memory through the stack's runtime seam.

Strings and arrays the C API hands out (a platform name, a device list, a buffer's
dimensions) are owned by the object they describe and live as long as it does, as the
header requires; :class:`Owned` keeps them.
"""

from __future__ import annotations

import ctypes
import hashlib
from typing import Any

import numpy as np

from . import capi
from .table import PjrtError


class Owned:
    """Keeps the C strings and arrays an object has handed out alive with it; ``handle`` is
    the opaque pointer the framework holds for it."""

    handle: int = 0

    def __init__(self):
        self._owned: dict[str, Any] = {}

    def cstr(self, key: str, text: str) -> tuple[int, int]:
        raw = self._owned.get(key)
        if raw is None:
            raw = self._owned[key] = ctypes.create_string_buffer(text.encode())
        return ctypes.addressof(raw), len(raw.value)

    def array(self, key: str, ctype, values) -> int:
        arr = self._owned.get(key)
        if arr is None:
            values = list(values)
            arr = self._owned[key] = (ctype * max(1, len(values)))(*values)
        return ctypes.addressof(arr)

    def named_values(self, key: str, values: dict[str, Any]) -> tuple[int, int]:
        """A ``PJRT_NamedValue`` array of ``values`` (str, int, bool, float, list of int)."""
        arr = self._owned.get(key)
        if arr is None:
            keep: list = []
            arr = (capi.NamedValue * max(1, len(values)))()
            for nv, (name, v) in zip(arr, values.items()):
                nb = name.encode()
                keep.append(nb)
                nv.struct_size = ctypes.sizeof(capi.NamedValue)
                nv.name, nv.name_size = nb, len(nb)
                if isinstance(v, bool):
                    nv.type, nv.bool_value, nv.value_size = capi.NV_BOOL, v, 1
                elif isinstance(v, int):
                    nv.type, nv.int64_value, nv.value_size = capi.NV_INT64, v, 1
                elif isinstance(v, float):
                    nv.type, nv.float_value, nv.value_size = capi.NV_FLOAT, v, 1
                elif isinstance(v, (list, tuple)):
                    ints = (ctypes.c_int64 * max(1, len(v)))(*v)
                    keep.append(ints)
                    nv.type, nv.value_size = capi.NV_INT64_LIST, len(v)
                    nv.int64_array_value = ctypes.cast(ints, ctypes.POINTER(ctypes.c_int64))
                else:
                    sb = str(v).encode()
                    keep.append(sb)
                    nv.type, nv.string_value, nv.value_size = capi.NV_STRING, sb, len(sb)
            self._owned[key + "/keep"] = keep
            self._owned[key] = arr
        return ctypes.addressof(arr), len(values)


class Memory(Owned):
    """A device's one memory space: its HBM, kind ``device``."""

    KIND = "device"
    KIND_ID = 0

    def __init__(self, device: "Device"):
        super().__init__()
        self.device = device
        self.id = device.index

    def describe(self) -> str:
        return f"{self.KIND} memory of {self.device.describe()}"


class Description(Owned):
    """A ``PJRT_DeviceDescription``: what JAX's ``Device`` shows (id, kind, attributes)."""

    def __init__(self, device: "Device"):
        super().__init__()
        self.device = device


class Device(Owned):
    """One simulated device of the stack as a PJRT device."""

    def __init__(self, client: "Client", index: int):
        super().__init__()
        self.client, self.index = client, index
        self.fornax = client.fornax.devices()[index]
        self.description = Description(self)
        self.memory = Memory(self)
        self.kind = self.fornax.device_kind

    def placement(self):
        return self.client.fornax.placement(self.index)

    def attributes(self) -> dict[str, Any]:
        p = self.fornax.properties()
        face = self.client.fornax.framework.face
        return {"family": self.client.family, "vendor_platform": face.pjrt_platform,
                "vendor_plugin": face.pjrt_plugin, "target": str(p["target"]),
                "compute_units": int(p["compute_units"]), "simd_width": int(p["simd_width"]),
                "memory_bytes": int(p["memory_bytes"]), "node": int(p["node"])}

    def describe(self) -> str:
        return f"{self.client.platform}:{self.index}"

    def debug_string(self) -> str:
        """``repr(device)`` in JAX."""
        return f"FornaxDevice(id={self.index}, family={self.client.family})"


class Client(Owned):
    """The plugin's client over one fornax JAX client (one composed stack)."""

    def __init__(self, fornax_client, family: str, platform: str):
        super().__init__()
        self.fornax, self.family, self.platform = fornax_client, family, platform
        face = fornax_client.framework.face
        self.platform_version = (f"fornax {family} ({face.pjrt_plugin} face, "
                                 f"{face.version_field} {face.version})")
        self.devices = [Device(self, i) for i in range(fornax_client.device_count())]
        self.executables: list = []
        self.topology: Any = None
        #: bumped when the client is rebound to a fresh stack (executables of an older one refuse to run)
        self.generation = 0

    def device(self, index: int) -> Device:
        return self.devices[index]

    def rebind(self, fornax_client) -> None:
        """Serve a freshly composed stack of the same config from now on (the same devices,
        handles and platform; buffers and executables of the old stack stay on it)."""
        if fornax_client.device_count() != len(self.devices):
            raise ValueError("a fresh stack must have the same devices")
        self.fornax = fornax_client
        for d in self.devices:
            d.fornax = fornax_client.devices()[d.index]
        self.executables = []
        self.generation += 1


class Topology:
    """``PJRT_TopologyDescription``: the client's devices as descriptions."""

    handle: int = 0

    def __init__(self, client: "Client"):
        self.client = client


class Buffer:
    """A ``PJRT_Buffer``: a fornax buffer (its bytes in simulated device memory) on a device."""

    def __init__(self, device: Device, fornax_buffer, pjrt_type: int):
        self.device, self.fornax, self.type = device, fornax_buffer, pjrt_type
        self.dims = (ctypes.c_int64 * max(1, len(fornax_buffer.shape)))(*fornax_buffer.shape)
        self.ndim = len(fornax_buffer.shape)
        self.external_refs = 0
        self.minor_to_major: Any = None

    def deleted(self) -> bool:
        return self.fornax.is_deleted()


class Executable(Owned):
    """A compiled program (``PJRT_Executable`` and, loaded on its device, ``PJRT_LoadedExecutable``)."""

    def __init__(self, client: Client, device: Device, compiled, text: str):
        super().__init__()
        self.client, self.device, self.compiled, self.text = client, device, compiled, text
        self.generation = client.generation
        self.deleted = False
        self.code_bytes = 0                  # the size of the program JAX handed over
        self.fingerprint = hashlib.sha256(text.encode()).hexdigest()[:32]

    @property
    def name(self) -> str:
        return self.compiled.name

    @property
    def out_avals(self) -> list:
        return self.compiled.out_avals


class LoadedExecutable:
    def __init__(self, executable: Executable):
        self.executable = executable


def pjrt_type_of(dtype) -> int:
    """The ``PJRT_Buffer_Type`` of a numpy dtype."""
    name = NP_TO_PJRT.get(np.dtype(dtype).name)
    if name is None:
        raise PjrtError(f"{np.dtype(dtype)} has no PJRT buffer type", capi.UNIMPLEMENTED)
    return capi.BUFFER_TYPES.index(name)


NP_TO_PJRT = {"bool": "PRED", "int8": "S8", "int16": "S16", "int32": "S32", "int64": "S64", "uint8": "U8",
              "uint16": "U16", "uint32": "U32", "uint64": "U64", "float16": "F16", "float32": "F32",
              "float64": "F64", "bfloat16": "BF16", "complex64": "C64", "complex128": "C128"}
PJRT_TO_NP = {v: k for k, v in NP_TO_PJRT.items()}
