"""The error hierarchy, vendor error tables, and the binary container framing."""

import struct
import zlib

import pytest

from fornax.layers.binary import (ContainerError, KernelBinary, pack_container, pack_records,
                                  unpack_container, unpack_records)
from fornax.layers.errors import (CATEGORIES, ConfigError, DeviceHangError, ErrorTable,
                                  FornaxError, InvalidArgumentError, MemoryFaultError,
                                  OutOfMemoryError, UnknownError, VendorCode)
from fornax.sim.faults import DeviceHang, OutOfDeviceMemory, PageFault

CODES = {
    "SUCCESS": {"value": 0, "category": "unknown"},
    "ERROR_INVALID_VALUE": {"value": 1, "category": "invalid_argument"},
    "ERROR_OUT_OF_MEMORY": {"value": 2, "category": "out_of_memory"},
    "ERROR_ILLEGAL_ADDRESS": {"value": 700, "category": "memory_fault"},
    "ERROR_LAUNCH_TIMEOUT": {"value": 702, "category": "hang"},
    "ERROR_UNKNOWN": {"value": 999, "category": "unknown"},
}
FAULTS = {"page_fault": "ERROR_ILLEGAL_ADDRESS", "out_of_memory": "ERROR_OUT_OF_MEMORY",
          "hang": "ERROR_LAUNCH_TIMEOUT", "unknown": "ERROR_UNKNOWN"}


@pytest.fixture
def table():
    return ErrorTable("CUresult", CODES, FAULTS, seam="driver", vendor="cuda-like")


def test_table_maps_names_to_exact_values(table):
    assert table.code("ERROR_ILLEGAL_ADDRESS") == VendorCode("CUresult", "ERROR_ILLEGAL_ADDRESS", 700)
    assert table.code("ERROR_UNKNOWN").value == 999
    assert table.by_value(702).name == "ERROR_LAUNCH_TIMEOUT"
    assert table.by_value(0).name == "SUCCESS"
    with pytest.raises(KeyError):
        table.by_value(12345)
    with pytest.raises(KeyError):
        table.code("NOT_A_CODE")
    err = table.error("ERROR_INVALID_VALUE", "bad size", op="cuMemAlloc")
    assert isinstance(err, InvalidArgumentError)
    assert err.code.value == 1 and err.seam == "driver" and err.vendor == "cuda-like"


def test_hex_codes_print_in_hex():
    t = ErrorTable("ze_result_t", {"ZE_RESULT_ERROR_DEVICE_LOST": {"value": 0x70000001,
                                                                   "category": "device_lost"}},
                   {}, seam="driver", vendor="xpu-like", hex=True)
    code = t.code("ZE_RESULT_ERROR_DEVICE_LOST")
    assert code.value == 1879048193
    assert str(code) == "ZE_RESULT_ERROR_DEVICE_LOST (0x70000001)"
    assert str(VendorCode("CUresult", "X", 700)) == "X (700)"


def test_table_rejects_bad_data():
    with pytest.raises(ConfigError, match="unknown category 'weird'"):
        ErrorTable("api", {"A": {"value": 1, "category": "weird"}}, {}, seam="driver", vendor="v")
    with pytest.raises(ConfigError, match="MISSING"):
        ErrorTable("api", {"A": {"value": 1, "category": "unknown"}}, {"hang": "MISSING"},
                   seam="driver", vendor="v")


def test_from_fault_maps_page_fault_and_keeps_address(table):
    fault = PageFault(0x7F0000001234, "read", 3, "no live mapping")
    err = table.from_fault(fault, op="cuLaunchKernel")
    assert isinstance(err, MemoryFaultError)
    assert err.code == VendorCode("CUresult", "ERROR_ILLEGAL_ADDRESS", 700)
    assert err.address == 0x7F0000001234
    assert "0x7f0000001234" in str(err)
    assert err.seam == "driver" and err.vendor == "cuda-like" and err.op == "cuLaunchKernel"
    assert err.to_dict()["address"] == 0x7F0000001234
    assert err.to_dict()["code"] == {"api": "CUresult", "name": "ERROR_ILLEGAL_ADDRESS", "value": 700}


def test_from_fault_other_kinds(table):
    oom = table.from_fault(OutOfDeviceMemory(10, 20, 30))
    assert isinstance(oom, OutOfMemoryError) and oom.code.value == 2 and oom.address is None
    hang = table.from_fault(DeviceHang("watchdog"))
    assert isinstance(hang, DeviceHangError) and hang.code.value == 702
    other = table.from_fault(ValueError("???"), seam="runtime")
    assert isinstance(other, UnknownError) and other.code.value == 999 and other.seam == "runtime"


def test_render_includes_everything():
    e = FornaxError("illegal address", seam="driver", vendor="cuda-like", op="cuLaunchKernel",
                    hint="check your indices", code=VendorCode("CUresult", "ERR_X", 700))
    text = e.render()
    assert text == ("[driver/cuda-like] cuLaunchKernel: illegal address [ERR_X (700)]"
                    " — check your indices")
    assert str(e) == text
    assert FornaxError("plain").render() == "plain"
    assert FornaxError("m", vendor="v").render() == "[v] m"
    d = e.to_dict()
    assert d["kind"] == "error" and d["hint"] == "check your indices" and d["message"] == "illegal address"


def test_categories_cover_the_hierarchy():
    for kind, cls in CATEGORIES.items():
        assert issubclass(cls, FornaxError) and cls.kind == kind


# ---- containers ----------------------------------------------------------------------
MAGIC = b"FXBN"


def test_container_roundtrip():
    header = {"target": "sm_90", "entries": ["a", "b"], "n": 3}
    payload = bytes(range(256)) * 3
    image = pack_container(MAGIC, header, payload)
    assert image[:4] == MAGIC
    assert unpack_container(MAGIC, image) == (header, payload)
    assert unpack_container(MAGIC, pack_container(MAGIC, {}, b"")) == ({}, b"")
    # the layout: frame, header, payload, crc32 of everything before it
    _, hlen, plen = struct.unpack_from("<4sII", image)
    assert plen == len(payload) and len(image) == 12 + hlen + plen + 4
    assert struct.unpack("<I", image[-4:])[0] == zlib.crc32(image[:-4])


def test_every_flipped_byte_is_detected():
    image = pack_container(MAGIC, {"k": "v"}, b"payload bytes")
    for i in range(len(image)):
        for bit in (0x01, 0x80):
            bad = bytearray(image)
            bad[i] ^= bit
            with pytest.raises(ContainerError):
                unpack_container(MAGIC, bytes(bad))


def test_truncation_and_trailing_bytes_are_detected():
    image = pack_container(MAGIC, {"k": "v"}, b"payload bytes")
    for n in range(len(image)):
        with pytest.raises(ContainerError):
            unpack_container(MAGIC, image[:n])
    with pytest.raises(ContainerError, match="trailing"):
        unpack_container(MAGIC, image + b"\0")


def test_wrong_magic():
    image = pack_container(b"ABCD", {}, b"x")
    with pytest.raises(ContainerError) as info:
        unpack_container(MAGIC, image)
    assert "ABCD" in str(info.value) and "FXBN" in str(info.value)
    with pytest.raises(ValueError):
        pack_container(b"TOOLONG", {}, b"")
    assert issubclass(ContainerError, ValueError)


def test_bad_header_with_valid_checksum():
    head = b"{not json"
    body = struct.pack("<4sII", MAGIC, len(head), 1) + head + b"p"
    image = body + struct.pack("<I", zlib.crc32(body))
    with pytest.raises(ContainerError, match="header"):
        unpack_container(MAGIC, image)


def test_records_roundtrip_and_truncation():
    recs = [b"", b"a", b"hello" * 10]
    data = pack_records(recs)
    assert unpack_records(data) == recs
    assert unpack_records(b"") == []
    for n in range(1, len(data)):
        try:
            out = unpack_records(data[:n])
        except ContainerError:
            continue
        assert out == recs[:len(out)]             # a clean cut at a record boundary


def test_kernel_binary_digest():
    a = KernelBinary("ptx-like", "sm_90", ("k",), b"abc")
    assert a == KernelBinary("ptx-like", "sm_90", ("k",), b"abc", metadata={"x": 1})
    assert a.digest == KernelBinary("ptx-like", "sm_90", ("other",), b"abc").digest
    assert a.digest != KernelBinary("ptx-like", "sm_80", ("k",), b"abc").digest
    assert a.digest != KernelBinary("cubin-like", "sm_90", ("k",), b"abc").digest
    assert a.digest != KernelBinary("ptx-like", "sm_90", ("k",), b"abd").digest
    assert len(a.digest) == 16
