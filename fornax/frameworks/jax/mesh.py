"""A ``shard_map``'s mesh over a client's devices: which device holds each mesh position,
the groups a collective over some of its axes runs in, and the block of a global array
each position holds under a ``PartitionSpec``.

Positions are numbered row-major over the mesh's axes (the first axis is the major
one), as ``mesh.devices.flat`` orders them.  A ``jax.sharding.Mesh`` built over fornax
devices (:func:`fornax.frameworks.jax.mesh`, ``jax.make_mesh(..., devices=fj.devices())``,
``jax.pmap(..., devices=fj.devices())``) maps each position to its device; a
``jax.sharding.AbstractMesh`` maps position ``k`` to the client's device ``k``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from jax.sharding import AbstractMesh

from .pjrt import Client, Device, JaxDeviceError


@dataclass(frozen=True)
class MeshLayout:
    """The mesh of one shard_map on one client."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    devices: tuple[int, ...]           # the device index of each position, row-major

    @classmethod
    def of(cls, mesh: Any, client: Client) -> "MeshLayout | str":
        """The layout of ``mesh`` on ``client``'s devices, or, for a mesh of devices that are
        not fornax's (jax's own CPU devices), the reason its shard_map runs on the host."""
        names = tuple(mesh.axis_names)
        shape = tuple(int(n) for n in mesh.axis_sizes)
        where = "(" + ", ".join(f"{n!r}: {s}" for n, s in zip(names, shape)) + ")"
        size = math.prod(shape)
        if isinstance(mesh, AbstractMesh):
            require_devices(client, f"shard_map over the abstract mesh {where}", size)
            return cls(names, shape, tuple(range(size)))
        flat = list(mesh.devices.flat)
        ours = [d for d in flat if isinstance(d, Device)]
        if not ours:
            kinds = sorted({str(getattr(d, "platform", type(d).__name__)) for d in flat})
            return (f"shard_map over a mesh of {', '.join(kinds)} devices runs on the host (jax's own "
                    f"implementation); build the mesh over fornax devices (fj.mesh, or "
                    f"jax.pmap(..., devices=fj.devices())) to run it on the simulated devices")
        strangers = [d for d in flat if not isinstance(d, Device) or d.client is not client]
        if strangers:
            raise JaxDeviceError(
                f"the shard_map's mesh {where} holds {strangers[0]!r}, which is not a device of this "
                f"client ({client.describe()})", seam="framework",
                hint="build the mesh over the devices of the client fj.jit runs on: "
                     "fj.mesh(shape, names, stack=...) or client.devices()")
        return cls(names, shape, tuple(d.id for d in ours))

    @property
    def size(self) -> int:
        return len(self.devices)

    def describe(self) -> str:
        return "(" + ", ".join(f"{n!r}: {s}" for n, s in zip(self.names, self.shape)) + ")"

    def coords(self, k: int) -> dict[str, int]:
        """Position ``k``'s index along each axis."""
        out: dict[str, int] = {}
        for name, n in zip(reversed(self.names), reversed(self.shape)):
            k, out[name] = divmod(k, n)
        return out

    def axis_env(self, k: int) -> dict[str, tuple[int, int]]:
        """Each axis's (index of position ``k``, size): what ``axis_index`` reads."""
        c = self.coords(k)
        return {name: (c[name], n) for name, n in zip(self.names, self.shape)}

    def linear(self, axes: tuple[str, ...], k: int) -> int:
        """Position ``k``'s index over ``axes`` together (the first one major)."""
        c, sizes = self.coords(k), dict(zip(self.names, self.shape))
        idx = 0
        for a in axes:
            idx = idx * sizes[a] + c[a]
        return idx

    def groups(self, axes: tuple[str, ...]) -> list[list[int]]:
        """The positions a collective over ``axes`` joins: those that agree on every other
        axis, each group ordered by :meth:`linear` over ``axes``."""
        rest = [a for a in self.names if a not in axes]
        by_key: dict[tuple[int, ...], dict[int, int]] = {}
        for k in range(self.size):
            c = self.coords(k)
            by_key.setdefault(tuple(c[a] for a in rest), {})[self.linear(axes, k)] = k
        return [[g[i] for i in sorted(g)] for g in by_key.values()]

    def block(self, spec: Any, shape: tuple[int, ...], k: int) -> tuple[slice, ...]:
        """The slices of a global array of ``shape`` that position ``k`` holds under the
        ``PartitionSpec`` ``spec`` (dimensions it does not name are whole)."""
        out = []
        entries = tuple(spec) + (None,) * (len(shape) - len(tuple(spec)))
        sizes = dict(zip(self.names, self.shape))
        for dim, entry in zip(shape, entries):
            axes = _axes(entry)
            n = math.prod(sizes[a] for a in axes)
            step = dim // n
            i = self.linear(axes, k)
            out.append(slice(i * step, (i + 1) * step))
        return tuple(out)

    def holders(self, spec: Any) -> list[int]:
        """One position per block of an output under ``spec``: those at index 0 of every
        axis ``spec`` does not name (the output is the same along those axes)."""
        named = {a for entry in tuple(spec) for a in _axes(entry)}
        return [k for k in range(self.size)
                if all(i == 0 for a, i in self.coords(k).items() if a not in named)]


def require_devices(client: Client, what: str, size: int) -> None:
    """``what`` (a mesh of ``size`` positions) fits the client's devices, or a clear error."""
    if size > client.device_count():
        raise JaxDeviceError(
            f"{what} needs {size} devices; the stack ({client.describe()}) has {client.device_count()}",
            seam="framework", hint=f"compose the stack with more devices: fj.use_stack(..., devices={size}), "
                                   f"fj.Client.for_vendor(..., devices={size}) or fornax compose --devices {size}")


def _axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes one entry of a PartitionSpec names (none, one, or a tuple)."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)
