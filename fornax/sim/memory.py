"""Device memory: per-context virtual address spaces over one device's HBM.

Every device has one virtual-address allocator (a unified address range, so
addresses are unique across contexts), and every context has its own page
table.  An access is legal only through a page of the accessing context's own
table, or of a context it was granted peer access to.  Anything else is a
:class:`PageFault` naming the address and the nearest mapping, never a Python
``IndexError``.  Mappings are separated by an unmapped guard page, so running
off the end of a buffer faults instead of silently reading its neighbour.

Backing is lazy: a mapping gets its numpy byte buffer on first touch.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field

import numpy as np

from .faults import MisalignedAddress, OutOfDeviceMemory, PageFault


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

    @property
    def end(self) -> int:
        return self.va + self.size

    @property
    def buffer(self) -> np.ndarray:
        if self._buffer is None:
            self._buffer = np.zeros(self.span, dtype=np.uint8)
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

    def __init__(self, capacity: int, page_size: int, device_index: int = 0):
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
        va = self._next_va
        self._next_va += span + self.page_size       # one guard page after every mapping
        return va, span

    def _release(self, mapping: Mapping) -> None:
        if mapping.kind is not MemoryKind.HOST_PINNED:
            self.used -= mapping.span
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
        self._mappings: dict[int, Mapping] = {}
        self._peers: list[AddressSpace] = []

    def mappings(self):
        return self._mappings.values()

    # -- mapping ----------------------------------------------------------
    def map(self, size: int, kind: MemoryKind = MemoryKind.DEVICE, label: str = "") -> Mapping:
        va, span = self.memory._reserve(size, kind)
        mapping = Mapping(va, size, span, kind, self.context, label)
        shift = self.memory.page_shift
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
    def _lookup(self, vpn: int) -> Mapping | None:
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

    def write(self, address: int, data) -> None:
        raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        mapping, off = self.resolve(address, raw.size, "write")
        mapping.buffer[off: off + raw.size] = raw

    def _element_view(self, addresses: np.ndarray, dtype: np.dtype, access: str):
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
        out = []
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

    def gather(self, addresses: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """Read one element of ``dtype`` at each byte address (a flat int64 array)."""
        dtype = np.dtype(dtype)
        result = np.empty(addresses.shape, dtype=dtype)
        for mask, mapping, index in self._element_view(addresses, dtype, "read"):
            usable = mapping.span - mapping.span % dtype.itemsize
            if mask is None:
                return mapping.buffer[:usable].view(dtype)[index]
            result[mask] = mapping.buffer[:usable].view(dtype)[index]
        return result

    def scatter(self, addresses: np.ndarray, values: np.ndarray) -> None:
        """Write ``values[i]`` at byte address ``addresses[i]``."""
        dtype = values.dtype
        for mask, mapping, index in self._element_view(addresses, dtype, "write"):
            usable = mapping.span - mapping.span % dtype.itemsize
            mapping.buffer[:usable].view(dtype)[index] = values if mask is None else values[mask]
