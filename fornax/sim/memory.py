"""Device memory: per-context virtual address spaces over one device's HBM.

Every device has one virtual-address allocator (a unified address range, so
addresses are unique across contexts), and every context has its own page
table.  An access is legal only through a page of the accessing context's own
table, or of a context it was granted peer access to.  Anything else is a
:class:`PageFault` naming the address and the nearest mapping, never a Python
``IndexError``.  Mappings are separated by an unmapped guard page, so running
off the end of a buffer faults instead of silently reading its neighbour.

Backing is lazy: a mapping gets its numpy byte buffer on first touch.

Writes made while a timeline packet runs are *deferred*: they go into the
packet's :class:`WriteLog` and reach memory only when the timeline commits
the log, once simulated time passes the packet's end.  Reads always see
committed memory, so work that overlaps a writer in simulated time reads the
old contents.  A packet does not see its own pending writes.
"""

from __future__ import annotations

import bisect
import enum
import mmap
import sys
from collections.abc import Callable, ValuesView
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .faults import ExecutionError, MisalignedAddress, OutOfDeviceMemory, PageFault


class WriteLog:
    """The memory effects of one running packet, applied together by :meth:`commit`."""

    __slots__ = ("effects",)

    def __init__(self) -> None:
        self.effects: list[tuple[Callable[..., None], tuple[Any, ...]]] = []

    def __len__(self) -> int:
        return len(self.effects)

    def commit(self) -> None:
        for fn, args in self.effects:
            fn(*args)
        self.effects = []


_capture: WriteLog | None = None

#: elements of a mapping: an index array or a slice
ElementIndex = npt.NDArray[np.integer[Any]] | slice
#: an n-d box of a mapping's elements: (byte offset of the first, shape, byte strides of any sign)
Box = tuple[int, tuple[int, ...], tuple[int, ...]]


def begin_capture() -> WriteLog:
    """Start deferring memory effects into a new log (the timeline calls this per packet)."""
    global _capture
    _capture = WriteLog()
    return _capture


def end_capture() -> None:
    global _capture
    _capture = None


def capturing() -> bool:
    """Whether a packet is running now: memory changes only when its log commits, so what
    committed memory holds stays as it is until the packet's work returns."""
    return _capture is not None


def defer(fn: Callable[..., None], *args: Any) -> None:
    """Apply ``fn(*args)`` now, or at commit time when a packet is running."""
    if _capture is None:
        fn(*args)
    else:
        _capture.effects.append((fn, args))


def _store_bytes(mapping: "Mapping", off: int, raw: np.ndarray) -> None:
    buffer = mapping.buffer
    _populate(mapping, off, raw.size)
    buffer[off: off + raw.size] = raw


def _store_elements(mapping: "Mapping", dtype: np.dtype[Any], index: ElementIndex,
                    values: npt.NDArray[Any]) -> None:
    elements = AddressSpace.elements(mapping, dtype)
    if isinstance(index, slice) and mapping._fresh > 0:
        start, stop, step = index.indices(elements.size)
        if step == 1 and stop > start:
            _populate(mapping, start * dtype.itemsize, (stop - start) * dtype.itemsize)
    elements[index] = values


#: a deferred write of at least this many elements that repeats one value keeps the value once
_REPEATED = 1 << 16
#: unsigned integers as wide as an element: the dtypes whose repeated values are found by bits
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _compact(index: ElementIndex, values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``values`` as a deferred write to the run of elements ``index`` keeps them: a write that
    repeats one value bit for bit (a fill) keeps that one element, broadcast at commit (the
    same bytes land); anything else as it is."""
    if not isinstance(index, slice) or values.ndim != 1 or values.size < _REPEATED:
        return values
    bits = _BITS.get(values.dtype.itemsize)
    if bits is None or not values.flags.c_contiguous:
        return values
    raw = values.view(bits)
    first = raw[0]
    if raw[-1] != first or raw[raw.size // 2] != first or raw.min() != raw.max():
        return values                  # (min and max: no temporary as large as the write)
    return values[:1].copy()


def _store_box(mapping: "Mapping", dtype: np.dtype[Any], box: Box, values: np.ndarray) -> None:
    AddressSpace.box(mapping, dtype, box)[...] = values


#: a backing buffer this large or larger is its own anonymous mapping of host memory
_OWN_PAGES = 4 << 20


#: madvise's MADV_POPULATE_WRITE (Linux 5.14 and later): make a range of pages resident at once
_POPULATE_WRITE: int | None = getattr(mmap, "MADV_POPULATE_WRITE",
                                      23 if sys.platform.startswith("linux") else None)
#: a write of this many bytes or more into pages not yet resident makes them resident first
_POPULATE_MIN = 8 << 20


def _zeroed(nbytes: int) -> tuple[np.ndarray, mmap.mmap | None]:
    """``nbytes`` of zeroed host memory backing a mapping, and the anonymous mapping of host
    pages it is when it has one of its own; its pages become resident as they are first
    written.  A large buffer is such a private mapping, without the transparent-huge-page
    hint numpy gives large arrays: on a virtual machine that hands free memory back to its
    host, first touches of huge pages are several times slower than of small ones."""
    if nbytes < _OWN_PAGES or not hasattr(mmap, "MAP_PRIVATE"):
        return np.zeros(nbytes, dtype=np.uint8), None
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(pages, dtype=np.uint8), pages


def _populate(mapping: "Mapping", off: int, nbytes: int) -> None:
    """Before a write of ``nbytes`` at ``off`` into ``mapping``'s own host pages while some
    may not be resident yet: make them resident in one call (one fault per page costs more,
    much more on a virtual machine).  Only a hint: the write itself is what it always is."""
    pages = mapping._pages
    if pages is None or nbytes < _POPULATE_MIN or mapping._fresh <= 0 or _POPULATE_WRITE is None:
        return
    start = off - off % mmap.PAGESIZE
    try:
        pages.madvise(_POPULATE_WRITE, start, min(off + nbytes, len(pages)) - start)
    except (OSError, ValueError):
        mapping._fresh = 0          # not supported here: leave it to first touches
        return
    mapping._fresh -= nbytes


class MemoryKind(enum.Enum):
    DEVICE = "device"
    HOST_PINNED = "host_pinned"
    MANAGED = "managed"


@dataclass(eq=False)
class Mapping:
    va: int
    size: int            # bytes requested
    span: int            # bytes mapped (whole pages)
    kind: MemoryKind
    context: int
    label: str = ""
    _buffer: np.ndarray | None = field(default=None, repr=False)
    meta: bool = False   # shape-only mode: accounted and page-checked, never backed by data
    #: the backing buffer viewed as elements of each dtype asked for (the executor's replay path)
    _views: dict[np.dtype[Any], npt.NDArray[Any]] = field(default_factory=dict, init=False, repr=False)
    #: the host pages of a large backing buffer, and how many of its bytes may not be resident yet
    _pages: mmap.mmap | None = field(default=None, init=False, repr=False)
    _fresh: int = field(default=0, init=False, repr=False)

    @property
    def end(self) -> int:
        return self.va + self.size

    @property
    def buffer(self) -> np.ndarray:
        if self.meta:
            raise ExecutionError(f"{self.describe()} belongs to a shape-only (meta) device and "
                                 "holds no data; run without meta mode to read or write values")
        if self._buffer is None:
            self._buffer, self._pages = _zeroed(self.span)
            self._fresh = self.span if self._pages is not None else 0
        return self._buffer

    @property
    def backed(self) -> bool:
        return self._buffer is not None

    def describe(self) -> str:
        name = f" {self.label!r}" if self.label else ""
        return (f"{self.kind.value} mapping{name} [{self.va:#x}, {self.end:#x}) "
                f"({self.size} bytes, context {self.context})")


class DeviceMemory:
    """The HBM of one device and its unified virtual-address allocator."""

    def __init__(self, capacity: int, page_size: int, device_index: int = 0, meta: bool = False):
        self.meta = meta     # shape-only: mappings are never backed; pages resolve by interval
        self.capacity = capacity
        self.page_size = page_size
        self.page_shift = page_size.bit_length() - 1
        # Each device owns its own slice of the 48-bit address space.
        self._next_va = (0x7F00 + 0x10 * device_index) << 32
        self.used = 0
        self.peak = 0
        self._spaces: dict[int, AddressSpace] = {}
        self._all: list[Mapping] = []          # every live mapping, sorted by va
        self._next_context = 1
        self.device_index = device_index
        self.clock: Callable[[], float] = lambda: 0.0               # host time, for usage_log (the Device wires it)
        self.usage_log: list[tuple[float, int]] = []   # (host time, bytes in use) at each change
        self.usage_limit = 100_000             # past it the oldest half of usage_log goes
        self.fabric: list[DeviceMemory] = []   # the other devices' memories on one topology

    # -- contexts ---------------------------------------------------------
    def create_space(self) -> "AddressSpace":
        space = AddressSpace(self, self._next_context)
        self._spaces[space.context] = space
        self._next_context += 1
        return space

    def destroy_space(self, space: "AddressSpace") -> None:
        for mapping in list(space.mappings()):
            space.unmap(mapping.va)
        self._spaces.pop(space.context, None)

    # -- allocation -------------------------------------------------------
    def _reserve(self, size: int, kind: MemoryKind) -> tuple[int, int]:
        if size <= 0:
            raise ValueError(f"mapping size must be positive, got {size}")
        pages = -(-size // self.page_size)
        span = pages * self.page_size
        if kind is not MemoryKind.HOST_PINNED:
            if self.used + span > self.capacity:
                raise OutOfDeviceMemory(size, self.used, self.capacity)
            self.used += span
            self.peak = max(self.peak, self.used)
            self._log_usage()
        va = self._next_va
        self._next_va += span + self.page_size       # one guard page after every mapping
        return va, span

    def _log_usage(self) -> None:
        self.usage_log.append((self.clock(), self.used))
        if len(self.usage_log) > self.usage_limit:
            del self.usage_log[:len(self.usage_log) - self.usage_limit // 2]

    def _release(self, mapping: Mapping) -> None:
        if mapping.kind is not MemoryKind.HOST_PINNED:
            self.used -= mapping.span
            self._log_usage()
        i = bisect.bisect_left([m.va for m in self._all], mapping.va)
        if i < len(self._all) and self._all[i] is mapping:
            del self._all[i]

    def owner_of(self, address: int) -> Mapping | None:
        """The live mapping (of any context) that covers ``address``."""
        vas = [m.va for m in self._all]
        i = bisect.bisect_right(vas, address) - 1
        if i >= 0 and self._all[i].va <= address < self._all[i].va + self._all[i].span:
            return self._all[i]
        return None

    def nearest(self, address: int, context: int) -> Mapping | None:
        candidates = [m for m in self._all if m.context == context]
        if not candidates:
            return None
        return min(candidates, key=lambda m: min(abs(address - m.va), abs(address - m.end)))


class AddressSpace:
    """One context's view of device memory: a page table and its mappings."""

    def __init__(self, memory: DeviceMemory, context: int):
        self.memory = memory
        self.context = context
        self._pages: dict[int, Mapping] = {}
        self._intervals: list[tuple[int, int, Mapping]] = []   # meta mode: (va, span, mapping)
        self._mappings: dict[int, Mapping] = {}
        self._peers: list[AddressSpace] = []

    def mappings(self) -> ValuesView[Mapping]:
        return self._mappings.values()

    # -- mapping ----------------------------------------------------------
    def map(self, size: int, kind: MemoryKind = MemoryKind.DEVICE, label: str = "") -> Mapping:
        va, span = self.memory._reserve(size, kind)
        # host-pinned memory is the host's (kernel-argument pools live there): it keeps its bytes
        mapping = Mapping(va, size, span, kind, self.context, label,
                          meta=self.memory.meta and kind is not MemoryKind.HOST_PINNED)
        shift = self.memory.page_shift
        if self.memory.meta:
            # shape-only spaces map many GiB: one interval per mapping instead of one entry per page
            bisect.insort(self._intervals, (va, span, mapping), key=lambda e: e[0])
        else:
            for vpn in range(va >> shift, (va + span) >> shift):
                self._pages[vpn] = mapping
        self._mappings[va] = mapping
        bisect.insort(self.memory._all, mapping, key=lambda m: m.va)
        return mapping

    def unmap(self, va: int) -> Mapping:
        mapping = self._mappings.pop(va, None)
        if mapping is None:
            raise PageFault(va, "free", self.context, self._explain(va))
        shift = self.memory.page_shift
        if self.memory.meta:
            i = bisect.bisect_left(self._intervals, mapping.va, key=lambda e: e[0])
            del self._intervals[i]
        for vpn in range(mapping.va >> shift, (mapping.va + mapping.span) >> shift):
            self._pages.pop(vpn, None)
        self.memory._release(mapping)
        return mapping

    def grant_peer(self, other: "AddressSpace") -> None:
        """Let this context access ``other``'s mappings."""
        if other is not self and other not in self._peers:
            self._peers.append(other)

    def revoke_peer(self, other: "AddressSpace") -> None:
        if other in self._peers:
            self._peers.remove(other)

    # -- translation ------------------------------------------------------
    def _interval(self, vpn: int) -> Mapping | None:
        address = vpn << self.memory.page_shift
        i = bisect.bisect_right(self._intervals, address, key=lambda e: e[0]) - 1
        if i >= 0 and address < self._intervals[i][0] + self._intervals[i][1]:
            return self._intervals[i][2]
        return None

    def _lookup(self, vpn: int) -> Mapping | None:
        if self.memory.meta:
            mapping = self._interval(vpn)
            for peer in self._peers if mapping is None else ():
                mapping = peer._interval(vpn) if peer.memory.meta else peer._pages.get(vpn)
                if mapping is not None:
                    break
            return mapping
        mapping = self._pages.get(vpn)
        if mapping is None:
            for peer in self._peers:
                mapping = peer._pages.get(vpn)
                if mapping is not None:
                    break
        return mapping

    def _explain(self, address: int) -> str:
        owner = self.memory.owner_of(address)
        if owner is not None and owner.context != self.context:
            return (f"the address belongs to context {owner.context} ({owner.describe()}) "
                    "and no peer access was granted")
        if owner is not None:
            return f"the address lies in the unused tail of {owner.describe()}"
        for other in self.memory.fabric:
            remote = other.owner_of(address)
            if remote is not None:
                return (f"the address belongs to device {other.device_index} ({remote.describe()}) "
                        f"and device {self.memory.device_index}'s context {self.context} has no "
                        "peer access to it")
        near = self.memory.nearest(address, self.context)
        if near is None:
            return "this context has no live mappings"
        where = "after" if address >= near.end else "before"
        dist = address - near.end if address >= near.end else near.va - address
        return f"no live mapping; nearest is {near.describe()}, {dist} bytes {where} it"

    def resolve(self, address: int, nbytes: int = 1, access: str = "read") -> tuple[Mapping, int]:
        """Mapping and byte offset for ``[address, address + nbytes)``, or a page fault."""
        mapping = self._lookup(address >> self.memory.page_shift)
        if mapping is None or address < mapping.va:
            raise PageFault(address, access, self.context, self._explain(address))
        if address + nbytes > mapping.end:
            bad = max(address, mapping.end)
            raise PageFault(bad, access, self.context,
                            f"access of {nbytes} bytes at {address:#x} runs past the end of "
                            f"{mapping.describe()}")
        return mapping, address - mapping.va

    def read(self, address: int, nbytes: int) -> bytes:
        mapping, off = self.resolve(address, nbytes, "read")
        return mapping.buffer[off: off + nbytes].tobytes()

    def write(self, address: int, data: bytes | bytearray | memoryview | npt.NDArray[Any],
              owned: bool = False) -> None:
        """Write ``data``'s bytes at ``address`` (deferred while a packet runs).  ``owned``: the
        caller never changes ``data`` again, so a deferred write keeps it instead of a copy."""
        view = data.data if isinstance(data, np.ndarray) else memoryview(data)   # the same view
        raw = np.frombuffer(view.cast("B"), dtype=np.uint8)
        mapping, off = self.resolve(address, raw.size, "write")
        if _capture is None:
            _store_bytes(mapping, off, raw)
        else:
            _capture.effects.append((_store_bytes, (mapping, off, raw if owned else raw.copy())))

    def _element_view(self, addresses: np.ndarray, dtype: np.dtype[Any], access: str
                      ) -> list[tuple[npt.NDArray[np.bool_] | None, Mapping, npt.NDArray[Any]]]:
        """Group element addresses by mapping; yield (mask, mapping, element indices)."""
        itemsize = dtype.itemsize
        if addresses.size == 0:
            return []
        misaligned = addresses % itemsize != 0
        if misaligned.any():
            bad = int(addresses[misaligned][0])
            raise MisalignedAddress(bad, access, self.context,
                                    f"{dtype.name} access must be {itemsize}-byte aligned")
        # fast path: a mapping is contiguous, so if the lowest and the highest
        # address fall inside the same one, every address in between does too
        lo, hi = int(addresses.min()), int(addresses.max())
        first = self._lookup(lo >> self.memory.page_shift)
        if first is not None and first.va <= lo and hi + itemsize <= first.end:
            return [(None, first, (addresses - first.va) // itemsize)]
        pages = addresses >> self.memory.page_shift
        uniq = np.unique(pages)
        groups: dict[int, list[int]] = {}
        owners: dict[int, Mapping] = {}
        for vpn in uniq.tolist():
            mapping = self._lookup(vpn)
            if mapping is None:
                bad = int(addresses[pages == vpn][0])
                raise PageFault(bad, access, self.context, self._explain(bad))
            owners[id(mapping)] = mapping
            groups.setdefault(id(mapping), []).append(vpn)
        out: list[tuple[npt.NDArray[np.bool_] | None, Mapping, npt.NDArray[Any]]] = []
        for key, vpns in groups.items():
            mapping = owners[key]
            mask = np.isin(pages, vpns) if len(groups) > 1 else np.ones(addresses.shape, bool)
            addrs = addresses[mask]
            past = addrs + itemsize > mapping.end
            if past.any():
                bad = int(addrs[past][0])
                raise PageFault(bad, access, self.context,
                                f"element access runs past the end of {mapping.describe()}")
            out.append((mask, mapping, (addrs - mapping.va) // itemsize))
        return out

    # -- the executor's replay path: one mapping known to hold every element ------------
    def holding(self, lo: int, end: int) -> Mapping | None:
        """The one mapping that holds all of ``[lo, end)``, or None (then the caller takes
        :meth:`gather` / :meth:`scatter`, which fault or split the access exactly)."""
        first = self._lookup(lo >> self.memory.page_shift)
        if first is not None and first.va <= lo and end <= first.end:
            return first
        return None

    @staticmethod
    def elements(mapping: Mapping, dtype: np.dtype) -> np.ndarray:
        """``mapping``'s committed bytes as elements of ``dtype`` (a view, made once)."""
        view = mapping._views.get(dtype)
        if view is None:
            usable = mapping.span - mapping.span % dtype.itemsize
            view = mapping._views[dtype] = mapping.buffer[:usable].view(dtype)
        return view

    @staticmethod
    def store_elements(mapping: Mapping, dtype: np.dtype[Any], index: ElementIndex, values: np.ndarray,
                       owned: bool = False) -> None:
        """Write ``values`` at element ``index`` (an index array or a slice) of ``mapping``,
        deferred like :meth:`scatter` while a packet runs (``owned``: the caller never
        changes ``values`` again, so a deferred write need not copy them)."""
        if _capture is not None:
            kept = _compact(index, values)
            if kept is values and not owned:
                kept = np.array(values, copy=True)
            _capture.effects.append((_store_elements, (mapping, dtype, index, kept)))
        else:
            _store_elements(mapping, dtype, index, values)

    @staticmethod
    def box(mapping: Mapping, dtype: np.dtype[Any], box: Box) -> np.ndarray:
        """A view of ``mapping``'s committed bytes as an n-d box of elements: ``box`` is
        (byte offset of the first element, shape, byte strides, any sign).  numpy checks
        that the whole box lies inside the mapping's buffer."""
        offset, shape, strides = box
        return np.ndarray(shape, dtype, buffer=mapping.buffer, offset=offset, strides=strides)

    @staticmethod
    def store_box(mapping: Mapping, dtype: np.dtype[Any], box: Box, values: np.ndarray) -> None:
        """Write ``values`` (shaped like the box) into the box :meth:`box` describes (its
        elements must be distinct), deferred like :meth:`store_elements`; the caller never
        changes ``values`` again."""
        if _capture is not None:
            _capture.effects.append((_store_box, (mapping, dtype, box, values)))
        else:
            _store_box(mapping, dtype, box, values)

    def gather(self, addresses: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """Read one element of ``dtype`` at each byte address (a flat int64 array)."""
        dtype = np.dtype(dtype)
        result = np.empty(addresses.shape, dtype=dtype)
        for mask, mapping, index in self._element_view(addresses, dtype, "read"):
            usable = mapping.span - mapping.span % dtype.itemsize
            if mask is None:
                whole: np.ndarray = mapping.buffer[:usable].view(dtype)[index]
                return whole
            result[mask] = mapping.buffer[:usable].view(dtype)[index]
        return result

    def scatter(self, addresses: np.ndarray, values: np.ndarray) -> None:
        """Write ``values[i]`` at byte address ``addresses[i]``."""
        dtype = values.dtype
        for mask, mapping, index in self._element_view(addresses, dtype, "write"):
            if _capture is not None:
                part = np.array(values, copy=True) if mask is None else values[mask]
                _capture.effects.append((_store_elements, (mapping, dtype, index, part)))
                continue
            usable = mapping.span - mapping.span % dtype.itemsize
            mapping.buffer[:usable].view(dtype)[index] = values if mask is None else values[mask]
