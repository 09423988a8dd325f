"""The PJRT C API's ABI, as ctypes structures: the ``PJRT_Api`` function table and the
argument struct of every function the plugin implements.

The layout is that of ``xla/pjrt/c/pjrt_c_api.h`` at API version 0.55 (the version the
plugin declares in ``PJRT_Api.pjrt_api_version``).  A framework built against a newer
header reads the plugin's version and calls nothing added after 0.55; it passes argument
structs that may be longer than these (new fields are appended, and every struct starts
with its ``struct_size``), so the plugin reads and writes only the fields listed here.

Every argument struct starts with ``size_t struct_size`` and ``PJRT_Extension_Base*
extension_start``; :func:`args` adds them.  Pointers are ``c_void_p`` (opaque handles,
C strings the plugin hands out, arrays it keeps alive), booleans ``c_bool``, enums ``c_int``.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_bool, c_char_p, c_float, c_int, c_int64, c_size_t, c_void_p

API_MAJOR = 0
API_MINOR = 55

P = c_void_p


class Version(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("extension_start", P),
                ("major_version", c_int), ("minor_version", c_int)]


class _Value(ctypes.Union):
    _fields_ = [("string_value", c_char_p), ("int64_value", c_int64),
                ("int64_array_value", POINTER(c_int64)), ("float_value", c_float), ("bool_value", c_bool)]


class NamedValue(ctypes.Structure):
    _anonymous_ = ("value",)
    _fields_ = [("struct_size", c_size_t), ("extension_start", P), ("name", c_char_p),
                ("name_size", c_size_t), ("type", c_int), ("value", _Value), ("value_size", c_size_t)]


# PJRT_NamedValue_Type
NV_STRING, NV_INT64, NV_INT64_LIST, NV_FLOAT, NV_BOOL = range(5)


class Program(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("extension_start", P), ("code", P), ("code_size", c_size_t),
                ("format", P), ("format_size", c_size_t)]


class ExecuteOptions(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("extension_start", P), ("send_callbacks", P),
                ("recv_callbacks", P), ("num_send_ops", c_size_t), ("num_recv_ops", c_size_t),
                ("launch_id", c_int), ("non_donatable_input_indices", POINTER(c_int64)),
                ("num_non_donatable_input_indices", c_size_t)]


class MemoryLayoutTiled(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("extension_start", P), ("minor_to_major", POINTER(c_int64)),
                ("minor_to_major_size", c_size_t), ("tile_dims", POINTER(c_int64)),
                ("tile_dim_sizes", POINTER(c_size_t)), ("num_tiles", c_size_t)]


class MemoryLayoutStrides(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("extension_start", P), ("byte_strides", POINTER(c_int64)),
                ("num_byte_strides", c_size_t)]


class _Layout(ctypes.Union):
    _fields_ = [("tiled", MemoryLayoutTiled), ("strides", MemoryLayoutStrides)]


class MemoryLayout(ctypes.Structure):
    _anonymous_ = ("layout",)
    _fields_ = [("struct_size", c_size_t), ("extension_start", P), ("layout", _Layout), ("type", c_int)]


LAYOUT_TILED, LAYOUT_STRIDES = 0, 1

#: PJRT_Error_Code (absl status codes)
CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, ALREADY_EXISTS, \
    PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE, \
    UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS, UNAUTHENTICATED = range(1, 17)

#: PJRT_Buffer_Type, in enum order
BUFFER_TYPES = ("INVALID", "PRED", "S8", "S16", "S32", "S64", "U8", "U16", "U32", "U64", "F16", "F32",
                "F64", "BF16", "C64", "C128", "F8E5M2", "F8E4M3FN", "F8E4M3B11FNUZ", "F8E5M2FNUZ",
                "F8E4M3FNUZ", "S4", "U4", "TOKEN", "S2", "U2", "F8E4M3", "F8E3M4")


def args(name: str, *fields: tuple) -> type[ctypes.Structure]:
    """The argument struct ``PJRT_<name>_Args``: the two header fields, then ``fields``."""
    return type(f"PJRT_{name}_Args", (ctypes.Structure,),
                {"_fields_": [("struct_size", c_size_t), ("extension_start", P), *fields]})


def _str_out(handle: str, field: str) -> tuple:
    return ((handle, P), (field, P), (field + "_size", c_size_t))


#: every function of the PJRT_Api table, in member order, with its argument struct (None:
#: the function takes ``PJRT_Error_*_Args`` and returns void)
ARGS: dict[str, type[ctypes.Structure]] = {}


def _add(name: str, *fields: tuple) -> None:
    ARGS[name] = args(name, *fields)


_add("Error_Destroy", ("error", P))
_add("Error_Message", ("error", P), ("message", P), ("message_size", c_size_t))
_add("Error_GetCode", ("error", P), ("code", c_int))
_add("Plugin_Initialize")
_add("Plugin_Attributes", ("attributes", P), ("num_attributes", c_size_t))
_add("Event_Destroy", ("event", P))
_add("Event_IsReady", ("event", P), ("is_ready", c_bool))
_add("Event_Error", ("event", P))
_add("Event_Await", ("event", P))
_add("Event_OnReady", ("event", P), ("callback", P), ("user_arg", P))
_add("Client_Create", ("create_options", P), ("num_options", c_size_t), ("kv_get_callback", P),
     ("kv_get_user_arg", P), ("kv_put_callback", P), ("kv_put_user_arg", P), ("client", P))
_add("Client_Destroy", ("client", P))
_add("Client_PlatformName", *_str_out("client", "platform_name"))
_add("Client_ProcessIndex", ("client", P), ("process_index", c_int))
_add("Client_PlatformVersion", *_str_out("client", "platform_version"))
_add("Client_Devices", ("client", P), ("devices", P), ("num_devices", c_size_t))
_add("Client_AddressableDevices", ("client", P), ("addressable_devices", P),
     ("num_addressable_devices", c_size_t))
_add("Client_LookupDevice", ("client", P), ("id", c_int), ("device", P))
_add("Client_LookupAddressableDevice", ("client", P), ("local_hardware_id", c_int),
     ("addressable_device", P))
_add("Client_AddressableMemories", ("client", P), ("addressable_memories", P),
     ("num_addressable_memories", c_size_t))
_add("Client_Compile", ("client", P), ("program", POINTER(Program)), ("compile_options", P),
     ("compile_options_size", c_size_t), ("executable", P))
_add("Client_DefaultDeviceAssignment", ("client", P), ("num_replicas", c_int), ("num_partitions", c_int),
     ("default_assignment_size", c_size_t), ("default_assignment", POINTER(c_int)))
_add("Client_BufferFromHostBuffer", ("client", P), ("data", P), ("type", c_int), ("dims", POINTER(c_int64)),
     ("num_dims", c_size_t), ("byte_strides", POINTER(c_int64)), ("num_byte_strides", c_size_t),
     ("host_buffer_semantics", c_int), ("device", P), ("memory", P), ("device_layout", POINTER(MemoryLayout)),
     ("done_with_host_buffer", P), ("buffer", P))
_add("DeviceDescription_Id", ("device_description", P), ("id", c_int))
_add("DeviceDescription_ProcessIndex", ("device_description", P), ("process_index", c_int))
_add("DeviceDescription_Attributes", ("device_description", P), ("num_attributes", c_size_t),
     ("attributes", P))
_add("DeviceDescription_Kind", *_str_out("device_description", "device_kind"))
_add("DeviceDescription_DebugString", *_str_out("device_description", "debug_string"))
_add("DeviceDescription_ToString", *_str_out("device_description", "to_string"))
_add("Device_GetDescription", ("device", P), ("device_description", P))
_add("Device_IsAddressable", ("device", P), ("is_addressable", c_bool))
_add("Device_LocalHardwareId", ("device", P), ("local_hardware_id", c_int))
_add("Device_AddressableMemories", ("device", P), ("memories", P), ("num_memories", c_size_t))
_add("Device_DefaultMemory", ("device", P), ("memory", P))
_STATS = ("bytes_in_use", "peak_bytes_in_use", "num_allocs", "largest_alloc_size", "bytes_limit",
          "bytes_reserved", "peak_bytes_reserved", "bytes_reservable_limit", "largest_free_block_bytes",
          "pool_bytes", "peak_pool_bytes")
_add("Device_MemoryStats", ("device", P), ("bytes_in_use", c_int64),
     *[f for s in _STATS[1:] for f in ((s, c_int64), (s + "_is_set", c_bool))])
MEMORY_STATS = _STATS
_add("Memory_Id", ("memory", P), ("id", c_int))
_add("Memory_Kind", *_str_out("memory", "kind"))
_add("Memory_DebugString", *_str_out("memory", "debug_string"))
_add("Memory_ToString", *_str_out("memory", "to_string"))
_add("Memory_AddressableByDevices", ("memory", P), ("devices", P), ("num_devices", c_size_t))
_add("Executable_Destroy", ("executable", P))
_add("Executable_Name", *_str_out("executable", "executable_name"))
_add("Executable_NumReplicas", ("executable", P), ("num_replicas", c_size_t))
_add("Executable_NumPartitions", ("executable", P), ("num_partitions", c_size_t))
_add("Executable_NumOutputs", ("executable", P), ("num_outputs", c_size_t))
_add("Executable_SizeOfGeneratedCodeInBytes", ("executable", P), ("size_in_bytes", c_int64))
_add("Executable_GetCostAnalysis", ("executable", P), ("num_properties", c_size_t), ("properties", P))
_add("Executable_OutputMemoryKinds", ("executable", P), ("num_outputs", c_size_t), ("memory_kinds", P),
     ("memory_kind_sizes", P))
_add("Executable_OptimizedProgram", ("executable", P), ("program", POINTER(Program)))
_add("Executable_Serialize", ("executable", P), ("serialized_bytes", P), ("serialized_bytes_size", c_size_t),
     ("serialized_executable", P), ("serialized_executable_deleter", P))
_add("LoadedExecutable_Destroy", ("executable", P))
_add("LoadedExecutable_GetExecutable", ("loaded_executable", P), ("executable", P))
_add("LoadedExecutable_AddressableDevices", ("executable", P), ("addressable_devices", P),
     ("num_addressable_devices", c_size_t))
_add("LoadedExecutable_Delete", ("executable", P))
_add("LoadedExecutable_IsDeleted", ("executable", P), ("is_deleted", c_bool))
_add("LoadedExecutable_Execute", ("executable", P), ("options", POINTER(ExecuteOptions)),
     ("argument_lists", POINTER(POINTER(P))), ("num_devices", c_size_t), ("num_args", c_size_t),
     ("output_lists", POINTER(POINTER(P))), ("device_complete_events", POINTER(P)), ("execute_device", P))
_add("Executable_DeserializeAndLoad", ("client", P), ("serialized_executable", P),
     ("serialized_executable_size", c_size_t), ("loaded_executable", P))
_add("LoadedExecutable_Fingerprint", *_str_out("executable", "executable_fingerprint"))
_add("Buffer_Destroy", ("buffer", P))
_add("Buffer_ElementType", ("buffer", P), ("type", c_int))
_add("Buffer_Dimensions", ("buffer", P), ("dims", P), ("num_dims", c_size_t))
_add("Buffer_UnpaddedDimensions", ("buffer", P), ("unpadded_dims", P), ("num_dims", c_size_t))
_add("Buffer_DynamicDimensionIndices", ("buffer", P), ("dynamic_dim_indices", P), ("num_dynamic_dims", c_size_t))
_add("Buffer_GetMemoryLayout", ("buffer", P), ("layout", MemoryLayout))
_add("Buffer_OnDeviceSizeInBytes", ("buffer", P), ("on_device_size_in_bytes", c_size_t))
_add("Buffer_Device", ("buffer", P), ("device", P))
_add("Buffer_Memory", ("buffer", P), ("memory", P))
_add("Buffer_Delete", ("buffer", P))
_add("Buffer_IsDeleted", ("buffer", P), ("is_deleted", c_bool))
_add("Buffer_CopyToDevice", ("buffer", P), ("dst_device", P), ("dst_buffer", P))
_add("Buffer_ToHostBuffer", ("src", P), ("host_layout", POINTER(MemoryLayout)), ("dst", P),
     ("dst_size", c_size_t), ("event", P))
_add("Buffer_IsOnCpu", ("buffer", P), ("is_on_cpu", c_bool))
_add("Buffer_ReadyEvent", ("buffer", P), ("event", P))
_add("Buffer_UnsafePointer", ("buffer", P), ("buffer_pointer", ctypes.c_size_t))
_add("Buffer_IncreaseExternalReferenceCount", ("buffer", P))
_add("Buffer_DecreaseExternalReferenceCount", ("buffer", P))
_add("Buffer_OpaqueDeviceMemoryDataPointer", ("buffer", P), ("device_memory_ptr", P))
_add("CopyToDeviceStream_Destroy", ("stream", P))
_add("CopyToDeviceStream_AddChunk", ("stream", P), ("chunk", P), ("transfer_complete", P))
_add("CopyToDeviceStream_TotalBytes", ("stream", P), ("total_bytes", c_int64))
_add("CopyToDeviceStream_GranuleSize", ("stream", P), ("granule_size_in_bytes", c_int64))
_add("CopyToDeviceStream_CurrentBytes", ("stream", P), ("current_bytes", c_int64))
_add("TopologyDescription_Create", ("topology_name", P), ("topology_name_size", c_size_t),
     ("create_options", P), ("num_options", c_size_t), ("topology", P))
_add("TopologyDescription_Destroy", ("topology", P))
_add("TopologyDescription_PlatformName", *_str_out("topology", "platform_name"))
_add("TopologyDescription_PlatformVersion", *_str_out("topology", "platform_version"))
_add("TopologyDescription_GetDeviceDescriptions", ("topology", P), ("descriptions", P),
     ("num_descriptions", c_size_t))
_add("TopologyDescription_Serialize", ("topology", P), ("serialized_bytes", P),
     ("serialized_bytes_size", c_size_t), ("serialized_topology", P), ("serialized_topology_deleter", P))
_add("TopologyDescription_Attributes", ("topology", P), ("attributes", P), ("num_attributes", c_size_t))
_add("Compile", ("topology", P), ("program", POINTER(Program)), ("compile_options", P),
     ("compile_options_size", c_size_t), ("client", P), ("executable", P))
_add("Executable_OutputElementTypes", ("executable", P), ("output_types", P), ("num_output_types", c_size_t))
_add("Executable_OutputDimensions", ("executable", P), ("num_outputs", c_size_t), ("dims", P),
     ("dim_sizes", P))
_add("Buffer_CopyToMemory", ("buffer", P), ("dst_memory", P), ("dst_buffer", P))
_add("Client_CreateViewOfDeviceBuffer", ("client", P), ("device_buffer_ptr", P), ("dims", P),
     ("num_dims", c_size_t), ("element_type", c_int), ("layout", P), ("device", P),
     ("on_delete_callback", P), ("on_delete_callback_arg", P), ("stream", ctypes.c_ssize_t), ("buffer", P))
_add("Executable_Fingerprint", *_str_out("executable", "executable_fingerprint"))
_add("Client_TopologyDescription", ("client", P), ("topology", P))
_add("Executable_GetCompiledMemoryStats", ("executable", P),
     *[(f, c_int64) for f in ("generated_code_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
                              "alias_size_in_bytes", "temp_size_in_bytes", "host_generated_code_size_in_bytes",
                              "host_argument_size_in_bytes", "host_output_size_in_bytes",
                              "host_alias_size_in_bytes", "host_temp_size_in_bytes")])
_add("Memory_Kind_Id", ("memory", P), ("kind_id", c_int))
_add("ExecuteContext_Create", ("context", P))
_add("ExecuteContext_Destroy", ("context", P))

#: the functions that return void (every other one returns ``PJRT_Error*``)
VOID = frozenset({"Error_Destroy", "Error_Message"})

ERROR_FN = ctypes.CFUNCTYPE(c_void_p, c_void_p)
VOID_FN = ctypes.CFUNCTYPE(None, c_void_p)
#: PJRT_Event_OnReadyCallback: void (*)(PJRT_Error* error, void* user_arg)
ON_READY = ctypes.CFUNCTYPE(None, c_void_p, c_void_p)


class Api(ctypes.Structure):
    """``PJRT_Api``: its size, extensions, version, then one function pointer per entry of :data:`ARGS`."""
    _fields_ = [("struct_size", c_size_t), ("extension_start", P), ("pjrt_api_version", Version),
                *[("PJRT_" + name, P) for name in ARGS]]
