"""Address spaces: mapping, translation, faults, capacity, lazy backing."""

import numpy as np
import pytest

from fornax.sim.faults import MisalignedAddress, OutOfDeviceMemory, PageFault
from fornax.sim.memory import DeviceMemory, MemoryKind
from fornax.sim.spec import load_spec

MiB = 1 << 20


@pytest.fixture
def mem():
    spec = load_spec("tiny")
    return DeviceMemory(spec.hbm_bytes, spec.page_size)


def test_map_write_read_roundtrip(mem):
    sp = mem.create_space()
    m = sp.map(1000, label="buf")
    data = np.arange(250, dtype=np.float32)
    sp.write(m.va, data.tobytes())
    back = np.frombuffer(sp.read(m.va, 1000), dtype=np.float32)
    np.testing.assert_array_equal(back, data)
    # an interior sub-range
    assert sp.read(m.va + 40, 8) == data[10:12].tobytes()
    # gather/scatter see the same bytes
    addrs = m.va + 4 * np.array([3, 0, 249], dtype=np.int64)
    np.testing.assert_array_equal(sp.gather(addrs, np.float32), [3.0, 0.0, 249.0])
    sp.scatter(addrs, np.array([-1, -2, -3], dtype=np.float32))
    back = np.frombuffer(sp.read(m.va, 1000), dtype=np.float32)
    assert back[3] == -1 and back[0] == -2 and back[249] == -3 and back[4] == 4


def test_mappings_are_page_aligned_and_distinct(mem):
    sp = mem.create_space()
    a, b = sp.map(10), sp.map(5000)
    assert a.va % 4096 == 0 and b.va % 4096 == 0
    assert a.span == 4096 and b.span == 8192
    assert b.va >= a.va + a.span + 4096          # a guard page in between
    sp.write(a.va, b"\x01" * 10)
    sp.write(b.va, b"\x02" * 5000)
    assert sp.read(a.va, 10) == b"\x01" * 10


def _fault(fn, *args):
    with pytest.raises(PageFault) as info:
        fn(*args)
    return info.value


def test_access_past_the_end_faults_naming_address_and_mapping(mem):
    sp = mem.create_space()
    m = sp.map(100, label="weights")
    # starts inside, runs past the end (still within the mapped page)
    e = _fault(sp.read, m.va + 96, 8)
    assert e.address == m.va + 100
    msg = str(e)
    assert f"{m.va + 100:#x}" in msg
    assert "weights" in msg and f"{m.va:#x}" in msg
    # starts in the unused tail of the last page
    e = _fault(sp.read, m.va + 200, 4)
    assert e.address == m.va + 200 and f"{m.va + 200:#x}" in str(e)
    assert "weights" in str(e)
    # element gather into the tail
    e = _fault(sp.gather, np.array([m.va + 100], dtype=np.int64), np.float32)
    assert e.address == m.va + 100 and "weights" in str(e)
    assert not isinstance(e, IndexError)


def test_guard_page_faults_and_names_nearest_mapping(mem):
    sp = mem.create_space()
    m = sp.map(4096, label="act")
    guard = m.va + m.span
    e = _fault(sp.read, guard, 4)
    assert e.address == guard and e.access == "read" and e.context == sp.context
    assert f"{guard:#x}" in str(e)
    assert "act" in str(e) and f"{m.va:#x}" in str(e)
    e = _fault(sp.write, guard + 8, b"\0\0\0\0")
    assert e.access == "write" and f"{guard + 8:#x}" in str(e)
    e = _fault(sp.scatter, np.array([guard], dtype=np.int64), np.zeros(1, np.float32))
    assert e.address == guard


def test_freed_memory_faults(mem):
    sp = mem.create_space()
    keep = sp.map(64, label="keeper")
    gone = sp.map(64, label="gone")
    sp.write(gone.va, b"x" * 64)
    sp.unmap(gone.va)
    e = _fault(sp.read, gone.va, 4)
    assert e.address == gone.va and f"{gone.va:#x}" in str(e)
    assert "keeper" in str(e)                   # the nearest live mapping
    e = _fault(sp.gather, np.array([gone.va], dtype=np.int64), np.uint8)
    assert e.address == gone.va
    # freeing twice is a fault too
    e = _fault(sp.unmap, gone.va)
    assert f"{gone.va:#x}" in str(e)
    # the keeper still works
    assert sp.read(keep.va, 4) == b"\0" * 4


def test_other_context_mapping_faults_until_peer_access(mem):
    a, b = mem.create_space(), mem.create_space()
    mb = b.map(256, label="theirs")
    b.write(mb.va, bytes(range(256)))
    e = _fault(a.read, mb.va + 16, 4)
    assert e.context == a.context
    msg = str(e)
    assert f"{mb.va + 16:#x}" in msg
    assert f"context {b.context}" in msg
    e = _fault(a.gather, np.array([mb.va], dtype=np.int64), np.uint8)
    assert f"context {b.context}" in str(e)
    e = _fault(a.write, mb.va, b"zz")
    assert b.read(mb.va, 2) == bytes([0, 1])    # nothing was written
    a.grant_peer(b)
    assert a.read(mb.va + 16, 4) == bytes([16, 17, 18, 19])
    np.testing.assert_array_equal(a.gather(np.array([mb.va + 5], dtype=np.int64), np.uint8), [5])
    # grant is one-directional
    ma = a.map(16)
    _fault(b.read, ma.va, 1)
    a.revoke_peer(b)
    _fault(a.read, mb.va, 1)


def test_misaligned_gather_and_scatter(mem):
    sp = mem.create_space()
    m = sp.map(64)
    with pytest.raises(MisalignedAddress) as info:
        sp.gather(np.array([m.va, m.va + 2], dtype=np.int64), np.float32)
    assert info.value.address == m.va + 2 and f"{m.va + 2:#x}" in str(info.value)
    with pytest.raises(MisalignedAddress):
        sp.scatter(np.array([m.va + 4], dtype=np.int64), np.zeros(1, np.float64))
    # aligned for float16 is fine
    sp.gather(np.array([m.va + 2], dtype=np.int64), np.float16)


def test_out_of_device_memory_reports_numbers():
    spec = load_spec("tiny")
    assert spec.hbm_bytes == 64 * MiB
    mem = DeviceMemory(spec.hbm_bytes, spec.page_size)
    sp = mem.create_space()
    sp.map(60 * MiB)
    assert mem.used == 60 * MiB
    with pytest.raises(OutOfDeviceMemory) as info:
        sp.map(8 * MiB)
    e = info.value
    assert (e.requested, e.used, e.capacity) == (8 * MiB, 60 * MiB, 64 * MiB)
    msg = str(e)
    assert str(8 * MiB) in msg and str(60 * MiB) in msg and str(64 * MiB) in msg
    assert mem.used == 60 * MiB                 # a failed map reserves nothing
    sp.map(4 * MiB)                             # exactly fills the device
    assert mem.used == 64 * MiB
    with pytest.raises(OutOfDeviceMemory):
        sp.map(1)


def test_unmap_and_destroy_release_capacity(mem):
    sp = mem.create_space()
    m = sp.map(40 * MiB)
    sp.unmap(m.va)
    assert mem.used == 0
    sp.map(40 * MiB)
    assert mem.peak == 40 * MiB
    mem.destroy_space(sp)
    assert mem.used == 0
    mem.create_space().map(64 * MiB)


def test_managed_counts_against_capacity(mem):
    sp = mem.create_space()
    sp.map(1000, MemoryKind.MANAGED)
    assert mem.used == 4096


def test_lazy_backing(mem):
    sp = mem.create_space()
    m = sp.map(32 * MiB)
    assert not m.backed
    other = sp.map(4096)
    sp.write(other.va, b"a")
    assert not m.backed                         # touching a neighbour does not back it
    assert sp.read(m.va + 1000, 4) == b"\0" * 4  # untouched memory reads as zero
    assert m.backed
    n = sp.map(4096)
    assert not n.backed
    sp.scatter(np.array([n.va], dtype=np.int64), np.ones(1, np.int32))
    assert n.backed


def test_host_pinned_does_not_count_against_capacity(mem):
    sp = mem.create_space()
    pinned = sp.map(100 * MiB, MemoryKind.HOST_PINNED)   # more than the device holds
    assert mem.used == 0
    sp.write(pinned.va + 10, b"hi")
    assert sp.read(pinned.va + 10, 2) == b"hi"
    sp.map(64 * MiB)                            # the device is still fully available
    sp.unmap(pinned.va)
    assert mem.used == 64 * MiB


def test_zero_size_map_rejected(mem):
    with pytest.raises(ValueError):
        mem.create_space().map(0)
