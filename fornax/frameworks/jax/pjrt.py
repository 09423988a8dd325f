"""A PJRT-shaped device interface over one composed stack: where JAX puts its hardware
boundary.

JAX never sees kernels: it talks to a *client* that lists *devices*, holds
*buffers* in device memory, *compiles* a whole program and *executes* it on
buffers, with *events* saying when results are ready.  This module is that
interface in Python, over fornax's runtime seam (the shape of the PJRT C API;
it is not a loadable PJRT plugin)::

    client = Client.for_vendor("rocm-like")
    x = client.buffer_from_pyval(np.ones((4, 4), np.float32))   # host -> device
    exe = client.compile(lambda a: jnp.tanh(a @ a), x)           # jaxpr -> compiled program
    (y,) = exe.execute([x])                                      # buffers in, buffers out
    y.block_until_ready(); np.asarray(y)                          # device -> host

Transfers are explicit: a buffer's bytes live in simulated device memory from
:meth:`Client.buffer_from_pyval` until it is deleted (or collected); reading it
(``np.asarray(buffer)``, :meth:`Buffer.to_numpy`) is a device-to-host copy that
waits for the stream.

The client lists every simulated device of its stack (:meth:`Client.devices`,
each with its properties).  Each device has a :class:`DevicePlacement`: its
stream, on which everything placed on that device runs in order, and its
buffers.  Compiled executables run on device 0; a ``shard_map`` program runs
its body on every device of its mesh (:mod:`.shard_map`).
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

import jax
import numpy as np

from ...layers.errors import ConfigError, FornaxError, InvalidArgumentError
from ...stack import Stack, compose, load_config, make_config
from . import lowering as L
from .program import build_program, device_address


class JaxDeviceError(FornaxError):
    """A buffer, device or executable was used in a way the client cannot honour."""

    kind = "device"


class Event:
    """Completion of the work enqueued before it on the client's stream."""

    def __init__(self, client: "Client", handle):
        self.client, self.handle = client, handle

    def is_ready(self) -> bool:
        return self.client.runtime.query_event(self.handle)

    def await_ready(self) -> None:
        self.client.runtime.event_synchronize(self.handle)

    def elapsed_ms(self, later: "Event") -> float:
        """Simulated device milliseconds from this event to ``later``."""
        return self.client.runtime.elapsed_time(self.handle, later.handle)


class Device:
    """One simulated device of the client, named in the family's vocabulary: ``jax.Device``'s
    fields (``id``, ``platform``, ``device_kind``, ``process_index``, ``local_hardware_id``)
    and the driver's :meth:`properties`.  A ``jax.sharding.Mesh`` can be built over them."""

    def __init__(self, client: "Client", index: int):
        self.client, self.id = client, index
        self._props = client.stack.driver.properties(index)
        self.device_kind = self._props.name
        self.local_hardware_id = index
        self.process_index = 0
        self.platform = client.platform
        topology = client.stack.topology
        #: the node the device sits on (the stack's ``nodes``; 0 on one node)
        self.node = topology.node_of[index] if topology is not None else 0

    def properties(self) -> dict[str, Any]:
        """The device as the driver describes it: name, arch target, compute units, SIMD
        width, memory bytes, node, and the family's own fields (``native``)."""
        p = self._props
        return {"id": self.id, "name": p.name, "target": p.target, "compute_units": p.compute_units,
                "simd_width": p.simd_width, "memory_bytes": p.memory_bytes, "node": self.node,
                "native": dict(p.native)}

    def memory_stats(self) -> dict:
        return self.client.runtime.memory_stats(self.id)

    def __str__(self) -> str:
        return f"{self.platform}:{self.id}"

    def __repr__(self) -> str:
        return f"{self.client.device_class}(id={self.id})"


class Buffer:
    """An array in simulated device memory: its aval (shape, dtype), its device bytes and the
    event that says when they are written.  A PRNG key array is held as its raw data; a
    narrow or unsigned integer in the wider graph integer that carries it."""

    def __init__(self, placement: "DevicePlacement", aval, address: int | None, ready: Event | None,
                 owner: "Buffer | None" = None):
        self.placement, self.client, self.aval = placement, placement.client, aval
        client = self.client
        self._address = address
        self._generation = client.generation
        self.ready = ready
        self.device_shape = L.device_shape(aval)
        self.device_dtype = L.device_dtype_of(aval.dtype)
        self.nbytes = L.device_nbytes(aval)
        self._owner = owner                  # a view keeps its parent's bytes alive
        self._finalizer = None
        if address is not None and owner is None:
            self._finalizer = weakref.finalize(self, placement._release, address)
            self._finalizer.atexit = False     # at exit nothing waits on the simulated device
            placement._live[address] = self.nbytes

    # -- jax.Array-like ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.aval.shape)

    @property
    def dtype(self):
        return self.aval.dtype

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def device(self) -> Device:
        return self.placement.device

    def on_device_size_in_bytes(self) -> int:
        return self.nbytes

    def unsafe_buffer_pointer(self) -> int | None:
        """The simulated device address of the first byte (None for an empty buffer)."""
        return self.address

    @property
    def address(self) -> int | None:
        if self.is_deleted():
            raise JaxDeviceError("the buffer was deleted", seam="framework",
                                 hint="keep the buffer (or the array you made it from) alive")
        if self._generation != self.client.generation:
            raise JaxDeviceError(
                "the buffer's device memory was destroyed when the device was reset after "
                f"{self.client.resets[self._generation]}", seam="framework",
                hint="recompute it, or put the host value on the device again")
        return self._address

    def is_deleted(self) -> bool:
        if self._owner is not None:
            return self._owner.is_deleted()
        return self._finalizer is not None and not self._finalizer.alive

    def delete(self) -> None:
        """Give the device bytes back now (later use is an error)."""
        if self._finalizer is not None:
            self._finalizer()

    def is_ready(self) -> bool:
        return self.ready is None or self.ready.is_ready()

    def block_until_ready(self) -> "Buffer":
        if self.ready is not None:
            self.ready.await_ready()
        return self

    def device_array(self) -> np.ndarray:
        """A device-to-host copy of the bytes as the device holds them (key data, carried
        integers widened); waits for the work that writes them."""
        host = np.empty(self.device_shape, self.device_dtype.numpy)
        if self.nbytes:
            self.client.runtime.memcpy_d2h(host, device_address(self), self.placement.stream, blocking=True)
        self.client.counts["d2h_bytes"] += self.nbytes
        return host

    def to_numpy(self) -> np.ndarray:
        """A device-to-host copy of the value (waits for the work that writes it)."""
        return L.from_device_array(self.device_array(), self.aval)

    def __array__(self, dtype=None, copy=None):
        arr = np.asarray(self.to_numpy())
        return arr if dtype is None else arr.astype(dtype)

    def view(self, offset: int, aval) -> "Buffer":
        """A buffer of ``aval`` at byte ``offset`` inside this one (a scan's slice)."""
        return Buffer(self.placement, aval, None if self._address is None else device_address(self) + offset,
                      self.ready, owner=self if self._owner is None else self._owner)

    def __repr__(self) -> str:
        return f"Buffer({self.aval.str_short()}, {self.device()!r}, {self.nbytes} bytes)"


class HostValue:
    """A value whose dtype has no fornax device form (complex, ``uint64``, float8): it is made
    by a host-fallback equation and used by others, so it stays on the host between them
    and is never uploaded.  It answers the same questions a :class:`Buffer` does."""

    nbytes = 0
    ready = None

    def __init__(self, client: "Client", aval, value):
        self.client, self.aval = client, aval
        self.value = np.asarray(value)

    shape = Buffer.shape
    dtype = Buffer.dtype
    size = Buffer.size
    ndim = Buffer.ndim

    def to_numpy(self) -> np.ndarray:
        return self.value

    def __array__(self, dtype=None, copy=None):
        return self.value if dtype is None else self.value.astype(dtype)

    def is_deleted(self) -> bool:
        return False

    def is_ready(self) -> bool:
        return True

    def block_until_ready(self) -> "HostValue":
        return self

    def __repr__(self) -> str:
        return f"HostValue({self.aval.str_short()}, on the host: no fornax device dtype)"


class DevicePlacement:
    """The part of a client that lives on one of its devices: the device's stream (everything
    placed there runs in order on it), the buffers allocated there and the transfers to and
    from them (``client.placement(i)``; the client's own calls use device 0's).  It is what
    a program built for that device runs on (:class:`.program.ProgramClient`)."""

    def __init__(self, client: "Client", index: int):
        self.client, self.index = client, index
        self._live: dict[int, int] = {}
        with self.current():
            self.stream = client.runtime.default_stream()

    @property
    def device(self) -> Device:
        return self.client._devices[self.index]

    @property
    def runtime(self):
        return self.client.runtime

    @property
    def framework(self):
        return self.client.framework

    @property
    def generation(self) -> int:
        return self.client.generation

    @property
    def counts(self) -> Counter:
        return self.client.counts

    def record_route(self, primitive: str, route: str, reason: str = "", n: int = 1) -> None:
        self.client.record_route(primitive, route, reason, n)

    @contextmanager
    def current(self) -> Iterator[None]:
        """Make this device the runtime's current one (allocations, module loads) for a while."""
        rt = self.client.runtime
        prev = rt.current_device()
        if prev != self.index:
            rt.set_device(self.index)
        try:
            yield
        finally:
            if prev != self.index:
                rt.set_device(prev)

    def allocate(self, nbytes: int) -> int | None:
        if not nbytes:
            return None
        with self.current():
            return self.client.runtime.allocate(nbytes, self.stream)

    def _release(self, address: int) -> None:
        with self.client.lock:
            if self._live.pop(address, None) is not None:
                self.client.runtime.deallocate(address)

    def buffer_from_pyval(self, value, aval=None) -> Buffer:
        """Copy a host value into a new buffer on this device (see :meth:`Client.buffer_from_pyval`)."""
        if aval is None:
            aval = jax.typeof(value)
        if L.device_dtype(aval.dtype) is None:
            raise JaxDeviceError(f"{aval.dtype} has no fornax device dtype", seam="framework",
                                 hint="use float32/float16/bfloat16/float64, int8-64, uint8-32 or bool")
        host = L.to_device_array(value, aval, copy=False)    # the copy below stages its bytes
        with self.client.lock:
            address = self.allocate(host.nbytes)
            if address is not None:
                self.client.runtime.memcpy_h2d(address, host, self.stream)
            self.client.counts["h2d_bytes"] += host.nbytes
            return Buffer(self, aval, address, self.record())

    def value_from_pyval(self, value, aval) -> "Buffer | HostValue":
        """A program's value: a device buffer, or a :class:`HostValue` when ``aval``'s dtype
        has no device form (the equations using it run on the host too)."""
        if L.device_dtype(aval.dtype) is None:
            return HostValue(self.client, aval, value)
        return self.buffer_from_pyval(value, aval=aval)

    def empty(self, aval) -> Buffer:
        """A buffer on this device for a result of ``aval`` (written by the work enqueued next)."""
        return Buffer(self, aval, self.allocate(L.device_nbytes(aval)), None)

    def copy(self, buf: Buffer) -> Buffer:
        """A new buffer on this device holding ``buf``'s value (a device-to-device copy;
        ``buf`` must be on this device)."""
        out = self.empty(buf.aval)
        if buf.nbytes:
            self.client.runtime.memcpy_d2d(device_address(out), device_address(buf), buf.nbytes, self.stream)
        return out

    def record(self) -> Event:
        with self.current():
            return Event(self.client, self.client.runtime.record_event(self.stream))

    def own_results(self, args: list, outs: list) -> list:
        """A program's results as buffers of their own on this device, each ready when the work
        enqueued so far is: a parameter returned unchanged, or one value returned twice, is
        copied (deleting one result never deletes another array)."""
        seen = {id(b) for b in args}
        for k, b in enumerate(outs):
            if id(b) in seen:
                outs[k] = self.copy(b)
            seen.add(id(outs[k]))
        ev = self.record()
        for b in outs:
            if b.ready is None:
                b.ready = ev
        return outs

    def synchronize(self) -> None:
        self.client.runtime.stream_synchronize(self.stream)


class Client:
    """The PJRT-shaped client of one composed stack."""

    def __init__(self, stack: Stack, origin: str = ""):
        if stack.config.meta:
            raise ConfigError("the JAX client computes real values; a shape-only (meta) stack "
                              "cannot back it", seam="framework", hint="set meta = false in the config")
        self.stack, self.origin = stack, origin
        self.runtime, self.framework = stack.runtime, stack.framework
        face = self.framework.face
        self.platform = face.pjrt_platform
        self.plugin = face.pjrt_plugin
        self.platform_version = f"{face.version_field} {face.version}"
        self.device_class = f"{face.pjrt_platform.capitalize()}Device"
        self.lock = threading.RLock()
        self.generation = 0                  # bumped by reset_device
        self.resets: dict[int, str] = {}     # generation -> the error that led to its reset
        self._devices = [Device(self, i) for i in range(self.runtime.device_count())]
        self._placements: dict[int, DevicePlacement] = {}
        self.home = self.placement(0)
        #: the library's communicators a shard_map ran its collectives on, by device tuple
        self._communicators: dict[tuple[int, ...], Any] = {}
        #: every collective those communicators ran for this client (the report's rows)
        self.collectives: list[dict] = []
        self.counts: Counter = Counter()
        #: (primitive, route) -> equations; route: native | fallback | control
        self.routes: Counter = Counter()
        self.reasons: dict = {}

    @classmethod
    def for_vendor(cls, vendor: str, spec: str | None = None, devices: int | None = None) -> "Client":
        """A client of a stack of ``vendor`` on ``spec`` with ``devices`` simulated devices."""
        return cls(compose(make_config(vendor, spec=spec, devices=devices)), f"vendor {vendor}")

    @classmethod
    def for_config(cls, path: str) -> "Client":
        return cls(compose(load_config(path)), f"config {path}")

    # -- devices and memory ------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        return list(self._devices)

    def local_devices(self) -> list[Device]:
        return self.devices()

    def device_count(self) -> int:
        return len(self._devices)

    def placement(self, device: "Device | int") -> DevicePlacement:
        """Device ``device``'s placement (its stream and buffers), made on first use."""
        index = device.id if isinstance(device, Device) else device
        p = self._placements.get(index)
        if p is None:
            p = self._placements[index] = DevicePlacement(self, index)
        return p

    def _placement_of(self, device) -> DevicePlacement:
        if device is None:
            return self.home
        if not isinstance(device, Device) or device.client is not self:
            raise JaxDeviceError(f"{device!r} is not a device of this client ({self.describe()})",
                                 seam="framework", hint="use one of client.devices()")
        return self.placement(device)

    @property
    def stream(self):
        """Device 0's stream: where executables run."""
        return self.home.stream

    def communicator(self, devices: tuple[int, ...]):
        """The stack library's communicator over ``devices`` (rank ``r`` on ``devices[r]``),
        made on first use and kept."""
        comm = self._communicators.get(devices)
        if comm is None:
            comm = self._communicators[devices] = self.stack.communicator(list(devices))
        return comm

    def reset_device(self, reason: str = "a device reset") -> None:
        """Reset the devices after an error left them unusable (a sticky context, a lost
        device): the runtime seam destroys each used device's context and everything in it;
        every buffer made before is a clear error when used and is dropped without a free;
        executables load their modules again on their next run."""
        with self.lock:
            for index in sorted(self._placements):
                self.runtime.device_reset(index)
            self.resets[self.generation] = reason
            self.generation += 1
            self._placements = {}
            self._communicators = {}
            self.home = self.placement(0)

    def allocate(self, nbytes: int) -> int | None:
        return self.home.allocate(nbytes)

    def live_buffers(self) -> int:
        return sum(len(p._live) for p in self._placements.values())

    def live_bytes(self) -> int:
        return sum(sum(p._live.values()) for p in self._placements.values())

    def memory_stats(self) -> dict:
        return {"live_buffers": self.live_buffers(), "bytes_in_use": self.live_bytes(),
                **{k: v for k, v in self.runtime.memory_stats().items() if isinstance(v, (int, float))}}

    # -- transfers ---------------------------------------------------------------------------------
    def buffer_from_pyval(self, value, device: Device | None = None, aval=None) -> Buffer:
        """Copy a host value (numpy array, jax array, Python scalar, key array) into a new buffer
        on ``device`` (device 0 when None); ``aval`` fixes its type (a jit argument's), else the
        value's own."""
        return self._placement_of(device).buffer_from_pyval(value, aval)

    def value_from_pyval(self, value, aval) -> "Buffer | HostValue":
        """A program's value on device 0: a device buffer, or a :class:`HostValue` when
        ``aval``'s dtype has no device form (the equations using it run on the host too)."""
        return self.home.value_from_pyval(value, aval)

    def empty(self, aval) -> Buffer:
        """A device-0 buffer for a result of ``aval`` (written by the work enqueued next)."""
        return self.home.empty(aval)

    def copy(self, buf: Buffer) -> Buffer:
        """A new buffer holding ``buf``'s value, on its device (a device-to-device copy)."""
        return buf.placement.copy(buf)

    def record(self) -> Event:
        return self.home.record()

    def synchronize(self) -> None:
        for p in list(self._placements.values()):
            p.synchronize()

    # -- programs ----------------------------------------------------------------------------------
    def compile(self, fn, *example_args, name: str | None = None) -> "LoadedExecutable":
        """Trace ``fn`` at the example arguments' avals (arrays, buffers or
        ``jax.ShapeDtypeStruct`` s) and compile the whole jaxpr for this client."""
        avals = [a.aval if isinstance(a, Buffer) else a for a in example_args]
        closed = jax.make_jaxpr(fn)(*avals)
        return LoadedExecutable(self, build_program(self, closed, name or str(getattr(fn, "__name__", "fn"))))

    def compile_jaxpr(self, closed, name: str = "jaxpr") -> "LoadedExecutable":
        """Compile a ClosedJaxpr (its invars are the executable's parameters)."""
        return LoadedExecutable(self, build_program(self, closed, name))

    # -- accounting ----------------------------------------------------------------------------------
    def record_route(self, primitive: str, route: str, reason: str = "", n: int = 1) -> None:
        self.routes[(primitive, route)] += n
        if reason and (primitive, route) not in self.reasons:
            self.reasons[(primitive, route)] = reason

    def describe(self) -> str:
        return self.stack.describe()

    def report(self) -> dict:
        """What the JAX front end did on this stack: equations per primitive and route
        (native: compiled into a device segment; fallback: run on the host, with the reason;
        control: a cond/while/scan driven from the host), programs, segments, transfers."""
        rows = [{"primitive": p, "route": r, "count": n, "reason": self.reasons.get((p, r), "")}
                for (p, r), n in self.routes.items()]
        rows.sort(key=lambda r: (-r["count"], r["primitive"]))
        totals: Counter[str] = Counter()
        for (_, r), n in self.routes.items():
            totals[r] += n
        return {"platform": self.platform, "plugin": self.plugin, "platform_version": self.platform_version,
                "stack": self.describe(), "origin": self.origin,
                "devices": [repr(d) for d in self._devices], "totals": dict(totals),
                "primitives": rows, "fallbacks": [r for r in rows if r["route"] == "fallback"],
                **dict(self.counts), "live_buffers": self.live_buffers(),
                "live_bytes": self.live_bytes(),
                **({"collectives": list(self.collectives)} if self.collectives else {})}


class LoadedExecutable:
    """A compiled program: ``execute`` takes one buffer per parameter and returns one buffer
    per result, in order, with the results' ready events recorded."""

    def __init__(self, client: Client, program):
        self.client, self.program = client, program
        self.name = program.name

    @property
    def in_avals(self) -> list:
        return [r.aval for r in self.program.ins]

    @property
    def out_avals(self) -> list:
        return [r.aval for r in self.program.outs]

    def execute(self, buffers: list[Buffer]) -> list[Buffer]:
        prog = self.program
        if len(buffers) != len(prog.ins):
            raise InvalidArgumentError(f"{self.name} takes {len(prog.ins)} buffer(s), got {len(buffers)}",
                                       seam="framework")
        for i, (b, ref) in enumerate(zip(buffers, prog.ins)):
            if not isinstance(b, Buffer) or b.client is not self.client:
                raise InvalidArgumentError(
                    f"{self.name}: argument {i} is {type(b).__name__}, not a buffer of this client",
                    seam="framework", hint="client.buffer_from_pyval(x) puts a host value on the device")
            if b.placement is not self.client.home:
                raise InvalidArgumentError(
                    f"{self.name}: argument {i} is on {b.device()!r}; executables run on device 0",
                    seam="framework", hint="client.buffer_from_pyval(np.asarray(b)) copies it to device 0")
            if b.shape != tuple(ref.aval.shape) or b.dtype != ref.aval.dtype:
                raise InvalidArgumentError(
                    f"{self.name}: argument {i} is {b.aval.str_short()}, the program takes "
                    f"{ref.aval.str_short()}", seam="framework")
        with self.client.lock:
            self.client.counts["executions"] += 1
            outs = prog.run(list(buffers))
            return self.client.home.own_results(list(buffers), outs)

    def as_text(self) -> str:
        return self.program.describe()
