"""The PJRT C API functions, implemented in Python over fornax's JAX client.

Each method is one C function (``Client_Create``, ``Buffer_ToHostBuffer``, ...); it reads its
argument struct and writes the outputs.  Transfers, memory and execution go through the
stack's runtime seam (``memcpy_h2d``/``memcpy_d2h``, the caching allocator, streams and
events), programs through its compiler seam (:mod:`.compile`).  Errors are
:class:`~.table.PjrtError` or fornax's own; :class:`~.table.Table` turns them into
``PJRT_Error`` s.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from ..lowering import device_dtype
from . import capi
from .objects import (PJRT_TO_NP, Buffer, Client, Description, Device, Executable, LoadedExecutable, Memory,
                      Owned, Topology, pjrt_type_of)
from .table import Event, PjrtError, Table


class Plugin:
    """The implementation behind the table: ``settings`` says which stack a client composes
    (:func:`..plugin.settings`)."""

    def __init__(self, settings):
        self.settings = settings
        self.table = Table(self)
        self.h = self.table.handles
        self.clients: list[Client] = []
        self.lock = threading.RLock()
        self._attrs = Owned()                # the plugin's attributes, alive as long as it is
        self.capsule: Any = None

    # -- plugin ------------------------------------------------------------------------------------
    def Plugin_Initialize(self, a) -> None:
        return None

    def Plugin_Attributes(self, a) -> None:
        from jaxlib.mlir.dialects import stablehlo
        cur = [int(p) for p in stablehlo.get_current_version().split(".")]
        low = [int(p) for p in stablehlo.get_minimum_version().split(".")]
        a.attributes, a.num_attributes = self._attrs.named_values("plugin", {
            "xla_version": 2, "stablehlo_current_version": cur, "stablehlo_minimum_version": low,
            "fornax_family": self.settings.vendor})

    # -- client ------------------------------------------------------------------------------------
    def Client_Create(self, a) -> None:
        client = self.settings.make_client()
        with self.lock:
            self.clients.append(client)
            a.client = self.h.new(client)
            client.handle = a.client
            for d in client.devices:
                d.handle = self.h.new(d)
                d.description.handle = self.h.new(d.description)
                d.memory.handle = self.h.new(d.memory)
            client.topology = Topology(client)
            client.topology.handle = self.h.new(client.topology)

    def fresh_stack(self) -> None:
        """Rebind every client to a freshly composed stack of the same settings: a measured
        run after a warm-up reports that run alone (``fornax compare``'s jax-pjrt worker)."""
        with self.lock:
            for c in self.clients:
                c.rebind(self.settings.make_client().fornax)

    def _client(self, handle) -> Client:
        return self.h.get(handle, Client, "PJRT_Client")

    def Client_Destroy(self, a) -> None:
        client = self.h.drop(a.client)
        if isinstance(client, Client):
            client.fornax.synchronize()
            for d in client.devices:
                for obj in (d, d.description, d.memory):
                    self.h.drop(obj.handle)
            self.h.drop(client.topology.handle)
            if client in self.clients:
                self.clients.remove(client)

    def Client_PlatformName(self, a) -> None:
        c = self._client(a.client)
        a.platform_name, a.platform_name_size = c.cstr("platform", c.platform)

    def Client_ProcessIndex(self, a) -> None:
        self._client(a.client)
        a.process_index = 0

    def Client_PlatformVersion(self, a) -> None:
        c = self._client(a.client)
        a.platform_version, a.platform_version_size = c.cstr("version", c.platform_version)

    def Client_Devices(self, a) -> None:
        c = self._client(a.client)
        a.devices = c.array("devices", ctypes.c_void_p, [d.handle for d in c.devices])
        a.num_devices = len(c.devices)

    def Client_AddressableDevices(self, a) -> None:
        c = self._client(a.client)
        a.addressable_devices = c.array("devices", ctypes.c_void_p, [d.handle for d in c.devices])
        a.num_addressable_devices = len(c.devices)

    def _lookup(self, c: Client, index: int) -> Device:
        if not 0 <= index < len(c.devices):
            raise PjrtError(f"no device {index}: the fornax stack ({c.fornax.describe()}) has "
                            f"{len(c.devices)} device(s)", capi.INVALID_ARGUMENT)
        return c.devices[index]

    def Client_LookupDevice(self, a) -> None:
        a.device = self._lookup(self._client(a.client), a.id).handle

    def Client_LookupAddressableDevice(self, a) -> None:
        a.addressable_device = self._lookup(self._client(a.client), a.local_hardware_id).handle

    def Client_AddressableMemories(self, a) -> None:
        c = self._client(a.client)
        a.addressable_memories = c.array("memories", ctypes.c_void_p, [d.memory.handle for d in c.devices])
        a.num_addressable_memories = len(c.devices)

    def Client_TopologyDescription(self, a) -> None:
        a.topology = self._client(a.client).topology.handle

    def Client_DefaultDeviceAssignment(self, a) -> None:
        c = self._client(a.client)
        need = a.num_replicas * a.num_partitions
        if need > len(c.devices):
            raise PjrtError(f"{a.num_replicas} replica(s) x {a.num_partitions} partition(s) need {need} "
                            f"devices; the fornax stack has {len(c.devices)}", capi.INVALID_ARGUMENT,
                            hint="compose the stack with more devices (FORNAX_PJRT_DEVICES)")
        if a.default_assignment_size < need:
            raise PjrtError("default_assignment is too small", capi.INVALID_ARGUMENT)
        for i in range(need):
            a.default_assignment[i] = i

    def Client_BufferFromHostBuffer(self, a) -> None:
        self._client(a.client)
        if a.device:
            device = self.h.get(a.device, Device, "PJRT_Device")
        elif a.memory:
            device = self.h.get(a.memory, Memory, "PJRT_Memory").device
        else:
            raise PjrtError("BufferFromHostBuffer names neither a device nor a memory", capi.INVALID_ARGUMENT)
        if a.device_layout:
            _check_default_layout(a.device_layout.contents, a.num_dims, "device_layout")
        dtype = _np_dtype(a.type)
        if device_dtype(dtype) is None:
            raise PjrtError(f"the fornax device holds no {dtype} buffers", capi.UNIMPLEMENTED,
                            hint="use float32/float16/bfloat16/float64, int8-64, uint8-32 or bool")
        dims = tuple(a.dims[i] for i in range(a.num_dims))
        host = _host_array(a.data, dtype, dims,
                           [a.byte_strides[i] for i in range(a.num_byte_strides)] if a.byte_strides else None)
        placement = device.placement()
        with placement.current():
            buf = placement.buffer_from_pyval(host, aval=_aval(dims, dtype))
        # the host bytes were staged by the copy: the caller may reuse them at once
        a.done_with_host_buffer = self.table.event(Event())
        a.buffer = self._new_buffer(device, buf, a.type)

    def _new_buffer(self, device: Device, fornax_buffer, pjrt_type: int | None = None) -> int:
        if pjrt_type is None:
            pjrt_type = pjrt_type_of(fornax_buffer.dtype)
        b = Buffer(device, fornax_buffer, pjrt_type)
        return self.h.new(b)

    def Client_Compile(self, a) -> None:
        from .compile import compile_program
        c = self._client(a.client)
        prog = a.program.contents
        fmt = ctypes.string_at(prog.format, prog.format_size).decode()
        code = ctypes.string_at(prog.code, prog.code_size)
        options = ctypes.string_at(a.compile_options, a.compile_options_size)
        exe = compile_program(c, fmt, code, options)
        exe.handle = self.h.new(exe)
        loaded = LoadedExecutable(exe)
        a.executable = self.h.new(loaded)

    # -- device descriptions, devices, memories ---------------------------------------------------------
    def _desc(self, handle) -> Description:
        return self.h.get(handle, Description, "PJRT_DeviceDescription")

    def DeviceDescription_Id(self, a) -> None:
        a.id = self._desc(a.device_description).device.index

    def DeviceDescription_ProcessIndex(self, a) -> None:
        self._desc(a.device_description)
        a.process_index = 0

    def DeviceDescription_Attributes(self, a) -> None:
        d = self._desc(a.device_description)
        a.attributes, a.num_attributes = d.named_values("attrs", d.device.attributes())

    def DeviceDescription_Kind(self, a) -> None:
        d = self._desc(a.device_description)
        a.device_kind, a.device_kind_size = d.cstr("kind", d.device.kind)

    def DeviceDescription_DebugString(self, a) -> None:
        d = self._desc(a.device_description)
        a.debug_string, a.debug_string_size = d.cstr("debug", d.device.describe())

    def DeviceDescription_ToString(self, a) -> None:
        d = self._desc(a.device_description)
        a.to_string, a.to_string_size = d.cstr("str", d.device.debug_string())

    def _device(self, handle) -> Device:
        return self.h.get(handle, Device, "PJRT_Device")

    def Device_GetDescription(self, a) -> None:
        a.device_description = self._device(a.device).description.handle

    def Device_IsAddressable(self, a) -> None:
        self._device(a.device)
        a.is_addressable = True

    def Device_LocalHardwareId(self, a) -> None:
        a.local_hardware_id = self._device(a.device).index

    def Device_AddressableMemories(self, a) -> None:
        d = self._device(a.device)
        a.memories = d.array("memories", ctypes.c_void_p, [d.memory.handle])
        a.num_memories = 1

    def Device_DefaultMemory(self, a) -> None:
        a.memory = self._device(a.device).memory.handle

    def Device_MemoryStats(self, a) -> None:
        d = self._device(a.device)
        stats = d.fornax.memory_stats()
        a.bytes_in_use = int(stats.get("allocated_bytes", stats.get("bytes_in_use", 0)))
        pairs = {"peak_bytes_in_use": stats.get("peak_allocated_bytes", stats.get("peak_bytes_in_use")),
                 "num_allocs": stats.get("num_allocs", stats.get("allocations")),
                 "bytes_limit": d.fornax.properties()["memory_bytes"],
                 "bytes_reserved": stats.get("reserved_bytes"),
                 "peak_bytes_reserved": stats.get("peak_reserved_bytes")}
        for name, value in pairs.items():
            if isinstance(value, (int, float)):
                setattr(a, name, int(value))
                setattr(a, name + "_is_set", True)

    def _memory(self, handle) -> Memory:
        return self.h.get(handle, Memory, "PJRT_Memory")

    def Memory_Id(self, a) -> None:
        a.id = self._memory(a.memory).id

    def Memory_Kind(self, a) -> None:
        m = self._memory(a.memory)
        a.kind, a.kind_size = m.cstr("kind", m.KIND)

    def Memory_Kind_Id(self, a) -> None:
        a.kind_id = self._memory(a.memory).KIND_ID

    def Memory_DebugString(self, a) -> None:
        m = self._memory(a.memory)
        a.debug_string, a.debug_string_size = m.cstr("debug", m.describe())

    def Memory_ToString(self, a) -> None:
        m = self._memory(a.memory)
        a.to_string, a.to_string_size = m.cstr("str", m.describe())

    def Memory_AddressableByDevices(self, a) -> None:
        m = self._memory(a.memory)
        a.devices = m.array("devices", ctypes.c_void_p, [m.device.handle])
        a.num_devices = 1

    # -- topology ------------------------------------------------------------------------------------
    def _topology(self, handle) -> Topology:
        return self.h.get(handle, Topology, "PJRT_TopologyDescription")

    def TopologyDescription_Destroy(self, a) -> None:
        return None                      # the client owns its topology

    def TopologyDescription_PlatformName(self, a) -> None:
        c = self._topology(a.topology).client
        a.platform_name, a.platform_name_size = c.cstr("platform", c.platform)

    def TopologyDescription_PlatformVersion(self, a) -> None:
        c = self._topology(a.topology).client
        a.platform_version, a.platform_version_size = c.cstr("version", c.platform_version)

    def TopologyDescription_GetDeviceDescriptions(self, a) -> None:
        c = self._topology(a.topology).client
        a.descriptions = c.array("descriptions", ctypes.c_void_p, [d.description.handle for d in c.devices])
        a.num_descriptions = len(c.devices)

    def TopologyDescription_Attributes(self, a) -> None:
        c = self._topology(a.topology).client
        a.attributes, a.num_attributes = c.named_values("topology", {"family": c.family,
                                                                     "devices": len(c.devices)})

    # -- buffers -------------------------------------------------------------------------------------
    def _buffer(self, handle) -> Buffer:
        return self.h.get(handle, Buffer, "PJRT_Buffer")

    def Buffer_Destroy(self, a) -> None:
        b = self.h.drop(a.buffer)
        if isinstance(b, Buffer) and not b.external_refs:
            b.fornax.delete()

    def Buffer_ElementType(self, a) -> None:
        a.type = self._buffer(a.buffer).type

    def Buffer_Dimensions(self, a) -> None:
        b = self._buffer(a.buffer)
        a.dims, a.num_dims = ctypes.addressof(b.dims), b.ndim

    def Buffer_UnpaddedDimensions(self, a) -> None:
        b = self._buffer(a.buffer)
        a.unpadded_dims, a.num_dims = ctypes.addressof(b.dims), b.ndim

    def Buffer_DynamicDimensionIndices(self, a) -> None:
        self._buffer(a.buffer)
        a.dynamic_dim_indices, a.num_dynamic_dims = None, 0

    def Buffer_GetMemoryLayout(self, a) -> None:
        b = self._buffer(a.buffer)
        # dense row-major: minor_to_major = (n-1, ..., 0), no tiles
        b.minor_to_major = (ctypes.c_int64 * max(1, b.ndim))(*range(b.ndim - 1, -1, -1))
        lay = a.layout
        lay.struct_size = ctypes.sizeof(capi.MemoryLayout)
        lay.type = capi.LAYOUT_TILED
        lay.tiled.struct_size = ctypes.sizeof(capi.MemoryLayoutTiled)
        lay.tiled.minor_to_major = ctypes.cast(b.minor_to_major, ctypes.POINTER(ctypes.c_int64))
        lay.tiled.minor_to_major_size = b.ndim
        lay.tiled.num_tiles = 0

    def Buffer_OnDeviceSizeInBytes(self, a) -> None:
        a.on_device_size_in_bytes = self._buffer(a.buffer).fornax.on_device_size_in_bytes()

    def Buffer_Device(self, a) -> None:
        a.device = self._buffer(a.buffer).device.handle

    def Buffer_Memory(self, a) -> None:
        a.memory = self._buffer(a.buffer).device.memory.handle

    def Buffer_Delete(self, a) -> None:
        self._buffer(a.buffer).fornax.delete()

    def Buffer_IsDeleted(self, a) -> None:
        a.is_deleted = self._buffer(a.buffer).deleted()

    def Buffer_IsOnCpu(self, a) -> None:
        self._buffer(a.buffer)
        a.is_on_cpu = False

    def Buffer_ReadyEvent(self, a) -> None:
        b = self._buffer(a.buffer)
        fb = b.fornax
        a.event = self.table.event(Event(fb.block_until_ready, probe=fb.is_ready))

    def Buffer_UnsafePointer(self, a) -> None:
        a.buffer_pointer = self._buffer(a.buffer).fornax.unsafe_buffer_pointer() or 0

    def Buffer_OpaqueDeviceMemoryDataPointer(self, a) -> None:
        a.device_memory_ptr = self._buffer(a.buffer).fornax.unsafe_buffer_pointer() or None

    def Buffer_IncreaseExternalReferenceCount(self, a) -> None:
        self._buffer(a.buffer).external_refs += 1

    def Buffer_DecreaseExternalReferenceCount(self, a) -> None:
        b = self._buffer(a.buffer)
        if b.external_refs <= 0:
            raise PjrtError("the buffer has no external reference to drop", capi.FAILED_PRECONDITION)
        b.external_refs -= 1

    def Buffer_ToHostBuffer(self, a) -> None:
        b = self._buffer(a.src)
        fb = b.fornax
        nbytes = int(np.prod(fb.shape, dtype=np.int64)) * np.dtype(fb.dtype).itemsize
        if not a.dst:                    # the first call asks for the size
            a.dst_size = nbytes
            return
        if a.host_layout:
            _check_default_layout(a.host_layout.contents, len(fb.shape), "host_layout")
        if a.dst_size < nbytes:
            raise PjrtError(f"dst holds {a.dst_size} bytes; the buffer's {fb.dtype}{list(fb.shape)} needs {nbytes}",
                            capi.INVALID_ARGUMENT)
        with b.device.placement().current():
            host = np.ascontiguousarray(fb.to_numpy())    # a device-to-host copy that waits for the stream
        if nbytes:
            ctypes.memmove(a.dst, host.ctypes.data, nbytes)
        a.event = self.table.event(Event())

    def Buffer_CopyToDevice(self, a) -> None:
        b = self._buffer(a.buffer)
        dst = self._device(a.dst_device)
        a.dst_buffer = self._copy(b, dst)

    def Buffer_CopyToMemory(self, a) -> None:
        b = self._buffer(a.buffer)
        dst = self._memory(a.dst_memory).device
        a.dst_buffer = self._copy(b, dst)

    def _copy(self, b: Buffer, dst: Device) -> int:
        with b.device.placement().current():
            host = None if dst is b.device else b.fornax.to_numpy()
        with dst.placement().current():
            if host is None:
                new = dst.placement().copy(b.fornax)
            else:   # between devices: through the host, as two copies on the two devices' streams
                new = dst.placement().buffer_from_pyval(host, aval=b.fornax.aval)
        return self._new_buffer(dst, new, b.type)

    # -- executables --------------------------------------------------------------------------------
    def _exe(self, handle) -> Executable:
        return self.h.get(handle, Executable, "PJRT_Executable")

    def _loaded(self, handle) -> LoadedExecutable:
        return self.h.get(handle, LoadedExecutable, "PJRT_LoadedExecutable")

    def Executable_Destroy(self, a) -> None:
        return None                      # the loaded executable owns it

    def Executable_Name(self, a) -> None:
        e = self._exe(a.executable)
        a.executable_name, a.executable_name_size = e.cstr("name", e.name)

    def Executable_NumReplicas(self, a) -> None:
        self._exe(a.executable)
        a.num_replicas = 1

    def Executable_NumPartitions(self, a) -> None:
        self._exe(a.executable)
        a.num_partitions = 1

    def Executable_NumOutputs(self, a) -> None:
        a.num_outputs = len(self._exe(a.executable).out_avals)

    def Executable_SizeOfGeneratedCodeInBytes(self, a) -> None:
        a.size_in_bytes = len(self._exe(a.executable).text)

    def Executable_GetCostAnalysis(self, a) -> None:
        e = self._exe(a.executable)
        a.properties, a.num_properties = e.named_values("cost", e.compiled.cost())

    def Executable_OutputMemoryKinds(self, a) -> None:
        e = self._exe(a.executable)
        n = len(e.out_avals)
        kind, size = e.cstr("kind", Memory.KIND)
        a.num_outputs = n
        a.memory_kinds = e.array("kinds", ctypes.c_void_p, [kind] * n)
        a.memory_kind_sizes = e.array("kind_sizes", ctypes.c_size_t, [size] * n)

    def Executable_OutputElementTypes(self, a) -> None:
        e = self._exe(a.executable)
        a.output_types = e.array("types", ctypes.c_int, [pjrt_type_of(v.dtype) for v in e.out_avals])
        a.num_output_types = len(e.out_avals)

    def Executable_OutputDimensions(self, a) -> None:
        e = self._exe(a.executable)
        a.num_outputs = len(e.out_avals)
        a.dims = e.array("dims", ctypes.c_int64, [d for v in e.out_avals for d in v.shape])
        a.dim_sizes = e.array("dim_sizes", ctypes.c_size_t, [len(v.shape) for v in e.out_avals])

    def Executable_OptimizedProgram(self, a) -> None:
        e = self._exe(a.executable)
        prog = a.program.contents
        code = e.text.encode()
        fmt, fmt_size = e.cstr("format", "mlir")
        prog.format, prog.format_size = fmt, fmt_size
        if not prog.code:
            prog.code_size = len(code)
            return
        if prog.code_size < len(code):
            raise PjrtError("the program buffer is too small", capi.INVALID_ARGUMENT)
        ctypes.memmove(prog.code, code, len(code))
        prog.code_size = len(code)

    def Executable_Fingerprint(self, a) -> None:
        e = self._exe(a.executable)
        a.executable_fingerprint, a.executable_fingerprint_size = e.cstr("fp", e.fingerprint)

    def Executable_GetCompiledMemoryStats(self, a) -> None:
        e = self._exe(a.executable)
        stats = e.compiled.memory_stats()
        for k, v in stats.items():
            setattr(a, k, int(v))

    def LoadedExecutable_Destroy(self, a) -> None:
        le = self.h.drop(a.executable)
        if isinstance(le, LoadedExecutable):
            self.h.drop(le.executable.handle)

    def LoadedExecutable_GetExecutable(self, a) -> None:
        a.executable = self._loaded(a.loaded_executable).executable.handle

    def LoadedExecutable_AddressableDevices(self, a) -> None:
        e = self._loaded(a.executable).executable
        a.addressable_devices = e.array("devices", ctypes.c_void_p, [e.device.handle])
        a.num_addressable_devices = 1

    def LoadedExecutable_Delete(self, a) -> None:
        self._loaded(a.executable).executable.deleted = True

    def LoadedExecutable_IsDeleted(self, a) -> None:
        a.is_deleted = self._loaded(a.executable).executable.deleted

    def LoadedExecutable_Fingerprint(self, a) -> None:
        e = self._loaded(a.executable).executable
        a.executable_fingerprint, a.executable_fingerprint_size = e.cstr("fp", e.fingerprint)

    def LoadedExecutable_Execute(self, a) -> None:
        e = self._loaded(a.executable).executable
        if e.deleted:
            raise PjrtError(f"{e.name} was deleted", capi.FAILED_PRECONDITION)
        if e.generation != e.client.generation:
            raise PjrtError(f"{e.name} was compiled for a stack the client has since replaced",
                            capi.FAILED_PRECONDITION, hint="jit the function again")
        if a.num_devices != 1:
            raise PjrtError(f"{e.name}: the fornax plugin runs a program on one device, not {a.num_devices}",
                            capi.UNIMPLEMENTED,
                            hint="multi-device programs (shard_map, pmap) run through fornax.frameworks.jax")
        device = e.device
        if a.execute_device:
            device = self._device(a.execute_device)
            if device is not e.device:
                raise PjrtError(f"{e.name} was compiled for {e.device.describe()}, not {device.describe()}",
                                capi.INVALID_ARGUMENT)
        args = [self._buffer(a.argument_lists[0][i]) for i in range(a.num_args)]
        donate = set()
        if a.options:
            opts = a.options.contents
            keep = {opts.non_donatable_input_indices[i] for i in range(opts.num_non_donatable_input_indices)}
            donate = {i for i in e.compiled.donated if i not in keep}
        with device.placement().current():
            outs = e.compiled.execute(device, [b.fornax for b in args], sorted(donate))
        out_list = a.output_lists[0]
        for i, fb in enumerate(outs):
            out_list[i] = self._new_buffer(device, fb)
        if a.device_complete_events:
            placement = device.placement()
            ev = placement.record()
            a.device_complete_events[0] = self.table.event(Event(ev.await_ready, probe=ev.is_ready))


def _np_dtype(pjrt_type: int) -> np.dtype:
    name = capi.BUFFER_TYPES[pjrt_type] if 0 <= pjrt_type < len(capi.BUFFER_TYPES) else f"#{pjrt_type}"
    np_name = PJRT_TO_NP.get(name)
    if np_name is None:
        raise PjrtError(f"the fornax device holds no {name} buffers", capi.UNIMPLEMENTED,
                        hint="use float32/float16/bfloat16/float64, int8-64, uint8-32 or bool")
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16) if np_name == "bfloat16" else np.dtype(np_name)


def _aval(dims: tuple[int, ...], dtype: np.dtype):
    from jax.core import ShapedArray
    return ShapedArray(dims, dtype)


def _host_array(data: int | None, dtype: np.dtype, dims: tuple[int, ...], byte_strides) -> np.ndarray:
    """A copy of the host array at ``data`` (dense row-major, or with ``byte_strides``)."""
    n = int(np.prod(dims, dtype=np.int64))
    if n == 0:
        return np.zeros(dims, dtype)
    if not data:
        raise PjrtError("BufferFromHostBuffer got a null data pointer", capi.INVALID_ARGUMENT)
    if byte_strides is None:
        byte_strides = []
        step = dtype.itemsize
        for d in reversed(dims):
            byte_strides.insert(0, step)
            step *= d
    if any(s < 0 for s in byte_strides):
        raise PjrtError(f"negative byte strides {list(byte_strides)} are not supported", capi.INVALID_ARGUMENT)
    span = sum((d - 1) * s for d, s in zip(dims, byte_strides)) + dtype.itemsize
    raw = (ctypes.c_char * span).from_address(data)
    view = np.ndarray(shape=dims, dtype=dtype, buffer=raw, strides=tuple(byte_strides))
    return np.array(view, dtype=dtype, copy=True)


def _check_default_layout(layout, ndim: int, what: str) -> None:
    if layout.type == capi.LAYOUT_TILED:
        t = layout.tiled
        order = [t.minor_to_major[i] for i in range(t.minor_to_major_size)]
        if order == list(range(ndim - 1, -1, -1)) and t.num_tiles == 0:
            return
        raise PjrtError(f"{what} minor_to_major {order} with {t.num_tiles} tile(s): the fornax device keeps "
                        f"arrays dense row-major", capi.UNIMPLEMENTED)
    raise PjrtError(f"{what} by strides is not supported: the fornax device keeps arrays dense row-major",
                    capi.UNIMPLEMENTED)
