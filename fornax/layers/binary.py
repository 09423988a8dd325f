"""KernelBinary: what compilers emit and drivers load.

A binary is a format tag (``ptx-like``, ``cubin-like``, ``hsaco-like``,
``spirv-like``, ...), the target it was built for (``sm_90``, ``gfx942``,
``compute_80``, ...), the entry points it defines, and its bytes.  The bytes
are the vendor's container; only the driver of a family that can read the
format decodes them.

:func:`pack_container` / :func:`unpack_container` are the one shared way to
frame a binary image: a magic number, a small header, a payload and a
checksum, so a truncated or corrupted image is detected at load.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
import zlib
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, NotRequired, TypedDict

from ..sim import isa


@dataclass(frozen=True)
class KernelBinary:
    format: str
    target: str
    entry_points: tuple[str, ...]
    data: bytes
    producer: str = ""                 # who built it ("cuda-like compiler", "rocm-like library", ...)
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @functools.cached_property
    def digest(self) -> str:
        """A short SHA-256 of the format, target and bytes (computed once: all three are fixed)."""
        return hashlib.sha256(self.format.encode() + b"\0" + self.target.encode() + b"\0"
                              + self.data).hexdigest()[:16]

    def __repr__(self) -> str:
        return (f"KernelBinary({self.format}, target={self.target}, "
                f"entries={list(self.entry_points)}, {len(self.data)} bytes)")


class ContainerError(ValueError):
    """The bytes are not a well-formed container of the expected kind."""


_FRAME = struct.Struct("<4sII")          # magic, header length, payload length


def pack_container(magic: bytes, header: dict[str, Any], payload: bytes) -> bytes:
    """Frame ``payload`` with ``magic`` (4 bytes), a JSON header and a CRC32."""
    if len(magic) != 4:
        raise ValueError("container magic must be 4 bytes")
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    body = _FRAME.pack(magic, len(head), len(payload)) + head + payload
    return body + struct.pack("<I", zlib.crc32(body))


def unpack_container(magic: bytes, data: bytes) -> tuple[dict[str, Any], bytes]:
    """Inverse of :func:`pack_container`; raises :class:`ContainerError` on any damage."""
    if len(data) < _FRAME.size + 4:
        raise ContainerError(f"image is {len(data)} bytes, too short for a container")
    got, hlen, plen = _FRAME.unpack_from(data)
    if got != magic:
        raise ContainerError(f"bad magic {got!r} (expected {magic!r})")
    if _FRAME.size + hlen + plen + 4 != len(data):
        raise ContainerError("image is truncated or has trailing bytes")
    (crc,) = struct.unpack_from("<I", data, len(data) - 4)
    if zlib.crc32(data[:-4]) != crc:
        raise ContainerError("checksum mismatch: the image is corrupt")
    try:
        header = json.loads(data[_FRAME.size:_FRAME.size + hlen])
    except ValueError as exc:
        raise ContainerError(f"unreadable header: {exc}") from None
    payload = data[_FRAME.size + hlen:_FRAME.size + hlen + plen]
    return header, payload


_RECORD = struct.Struct("<I")


def pack_records(records: list[bytes]) -> bytes:
    """Concatenate byte records, each prefixed with its length."""
    return b"".join(_RECORD.pack(len(r)) + r for r in records)


def unpack_records(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        if pos + _RECORD.size > len(data):
            raise ContainerError("truncated record table")
        (n,) = _RECORD.unpack_from(data, pos)
        pos += _RECORD.size
        if pos + n > len(data):
            raise ContainerError("record runs past the end of the image")
        out.append(data[pos:pos + n])
        pos += n
    return out


def pack_programs(magic: bytes, header: dict[str, Any], programs: list[isa.Program]) -> bytes:
    """A container whose payload is the encoded kernels, one record each."""
    return pack_container(magic, header, pack_records([isa.encode(p) for p in programs]))


def unpack_programs(magic: bytes, data: bytes) -> tuple[dict[str, Any], dict[str, isa.Program]]:
    """Inverse of :func:`pack_programs`: the header and the verified kernels by name."""
    header, payload = unpack_container(magic, data)
    programs = [isa.decode(r) for r in unpack_records(payload)]
    return header, {p.name: p for p in programs}


#: a family's image encoder: (programs, target, producer) -> one image of its format
Encoder = Callable[[list[isa.Program], str, str], KernelBinary]


class ShippedImage(TypedDict):
    """One entry of a library's ``[library] shipped``: an image it ships, and when it applies."""

    format: str
    target: str
    #: "exact" (that arch only), "virtual" (JIT for this arch or newer), "il" (built anywhere)
    rule: NotRequired[str]
