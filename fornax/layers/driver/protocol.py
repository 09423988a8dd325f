"""The driver seam's contract: the :class:`Driver` and :class:`Queue` Protocols and the
handles that cross the seam (:class:`DeviceProperties`, :class:`Context`, :class:`Module`,
:class:`Marker`).

A runtime (and everything above it) reaches a driver only through these.  A
driver implementation need not subclass :class:`~fornax.layers.driver.base.DriverBase`;
it must provide every member declared here.  Optional capabilities a family
may lack are small named Protocols of their own (:class:`FaultMapping`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, runtime_checkable

from numpy.typing import NDArray

from ...sim.device import Device
from ...sim.faults import SimError
from ...sim.isa import Program
from ...sim.memory import AddressSpace
from ...sim.spec import ChipSpec
from ...sim.timeline import HardwareQueue, Semaphore
from ..binary import KernelBinary
from ..errors import ErrorTable, FornaxError
from .kernel_log import KernelRecord

#: a kernel's arguments by parameter name (device addresses and scalars)
KernelArgs: TypeAlias = dict[str, Any]
#: what the host writes into host-accessible device memory
HostData: TypeAlias = "bytes | bytearray | memoryview | NDArray[Any]"


class ShapeOnlyArray(Protocol):
    """A host array without data: what a shape-only (meta) device copies, priced by size."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def nbytes(self) -> int: ...


#: the host side of a copy: an array, or on a shape-only device its shape alone
HostArray: TypeAlias = "NDArray[Any] | ShapeOnlyArray"


@dataclass(frozen=True)
class DeviceProperties:
    """One device as :meth:`Driver.properties` describes it."""

    index: int
    name: str
    target: str                      # the family's arch name: sm_90, gfx942, ...
    compute_units: int
    simd_width: int
    memory_bytes: int
    native: dict[str, Any]           # the same device in the family's own vocabulary


@dataclass(eq=False)
class Context:
    """A driver context: one device's address space and everything created in it."""

    handle: int
    device: Device
    space: AddressSpace
    sticky: FornaxError | None = None
    live: bool = True
    queues: list[Queue] = field(default_factory=list)     # every queue created in this context


@dataclass(eq=False)
class Module:
    """A loaded kernel binary: its decoded kernels, and how and at what cost it was loaded."""

    handle: int
    context: Context
    binary: KernelBinary
    kernels: dict[str, Program]
    load_s: float                    # simulated time the load took (JIT / IL build)
    how: str                         # "loaded", "jit", "built"
    entry: str = ""                  # a fat bundle's chosen image, "format:target"
    build_log: str = ""              # the JIT / IL build log (empty when the build said nothing)
    loaded: bool = True              # False once unloaded (or its context destroyed)


@dataclass(frozen=True)
class Marker:
    """A point on a queue's timeline: reached when ``sem`` reaches ``value``."""

    sem: Semaphore
    value: int


@runtime_checkable
class Queue(Protocol):
    """An ordered queue of device work (a stream, an AQL queue, a command list).

    Every call only enqueues: it validates its arguments at once (raising the family's
    driver error) and its effect happens when the device reaches it, in submission order
    after any :meth:`wait` before it.  Addresses are device virtual addresses in the
    queue's context; sizes are bytes."""

    flavour: str
    #: the simulated hardware queue this queue feeds; callers read its ``pending`` packets
    #: (work not yet retired) and ``failure`` (the fault that stopped it, or None)
    hwq: HardwareQueue
    #: share of the spec's launch latency charged to kernels launched now (1.0; a runtime
    #: lowers it while it replays a captured graph and restores it afterwards)
    launch_scale: float
    #: True once the queue was destroyed (by ``destroy_queue`` or its context's
    #: destruction); any later call on it raises ``invalid_handle``
    destroyed: bool

    def launch(self, module: Module, entry: str, grid: Sequence[int], args: KernelArgs) -> None:
        """Launch kernel ``entry`` of ``module`` (loaded in this queue's context) over ``grid``
        (one to three work-group counts; missing ones are 1) with ``args`` by parameter name.
        Raises on an unloaded module, unknown kernel, grid beyond the device's limits, or
        a missing argument."""
    def copy_h2d(self, dst: int, src: HostArray, host_rate: float = 1.0, held: bool = False) -> None:
        """Copy the host array ``src`` to ``dst`` (its bytes are staged at the call, unless
        ``held``: the caller keeps ``src`` unchanged until it has waited for the copy, which
        then reads ``src`` itself); ``host_rate`` is the share of the host link the host side
        sustains (1 for pinned)."""
    def copy_d2h(self, dst: HostArray, src: int, host_rate: float = 1.0) -> None:
        """Copy ``dst.nbytes`` bytes at ``src`` into the writable contiguous host array
        ``dst``, which fills when the copy completes.  On a shape-only device the host
        arrays of copies may be :class:`ShapeOnlyArray` (nothing moves)."""
    def copy_d2d(self, dst: int, src: int, nbytes: int) -> None:
        """Copy ``nbytes`` between two ranges of this queue's context."""
    def copy_peer(self, dst_ctx: Context, dst: int, src: int, nbytes: int,
                  link: int | None = None) -> None:
        """Copy ``nbytes`` at ``src`` here to ``dst`` in ``dst_ctx`` on another device, over
        the fabric (no peer access needed).  Raises when no fabric joins the devices.
        ``link`` (a collective library's channel part, ``Topology.ring_link``) prices the copy
        on the direct link to that device (``Topology.egress``); None: the copy's own route."""
    def record(self) -> Marker:
        """A marker reached once everything submitted so far has completed."""
    def wait(self, marker: Marker) -> None:
        """Later work on this queue starts only after ``marker`` (of any queue) is reached."""
    def waiting(self) -> list[Marker]:
        """The markers :meth:`wait` was given since the last command: what the next command
        waits for, and what :meth:`record`'s marker does not cover yet."""
    def synchronize(self) -> None:
        """The host waits for everything submitted; a fault of that work is raised mapped to
        the family's code (and may make the context sticky or the device lost)."""
    def enqueue(self, work: Callable[[], float], label: str, kind: str = "collective",
                engine: str = "compute") -> None:
        """Enqueue an operation whose effect ``work`` runs when the device reaches it and
        returns its simulated duration in seconds (a collective whose data another process
        moves: the work exchanges it, writes its result and prices the transfer).  A
        :class:`~fornax.sim.faults.SimError` it raises fails the queue like a faulting kernel."""


@dataclass(frozen=True)
class MediaEngine:
    """One physical media (video decode) engine of a device, as :meth:`Driver.media_engines`
    lists it: its timeline engine (``media0`` ..), its kind from the chip spec (``nvdec``,
    ``vcn``, ...), the codecs the family's decode API drives on it, the sessions its kind
    holds at most, and the live sessions bound to this engine."""

    name: str
    kind: str
    codecs: tuple[str, ...]
    max_sessions: int
    sessions: int


@runtime_checkable
class MediaQueue(Protocol):
    """A decode session (a decoder) on one media engine: decodes run in submission order on
    that engine, each writing one frame (``height x width x 3`` uint8 RGB) into device memory
    and taking the simulated time the chip spec gives; completion is tracked by a timeline
    semaphore like every queue's, so another queue can :meth:`Queue.wait` on :meth:`record`."""

    codec: str
    width: int                       # the largest frame this session decodes
    height: int
    engine: str                      # the timeline engine it runs on (media0, ...)
    kind: str                        # that engine's kind in the chip spec
    #: the family's names for this session: ``api`` (NVDECODE API, nvJPEG, rocDecode,
    #: oneVPL, ...), ``codec`` (its enum name there), ``create``, ``decode``, ``destroy``
    api: dict[str, str]
    hwq: HardwareQueue
    destroyed: bool

    def decode(self, bitstream: bytes, dst: int) -> None:
        """Decode one compressed frame (parsed and decoded on the host now) into ``dst`` when
        the device reaches it.  Raises ``invalid_value`` on a bad bitstream or a destination
        too small, and the family's not-supported error on a frame larger than the session's."""
    def record(self) -> Marker:
        """A marker reached once every decode submitted so far has landed."""
    def wait(self, marker: Marker) -> None:
        """Later decodes start only after ``marker`` (of any queue) is reached."""
    def synchronize(self) -> None:
        """The host waits for every decode submitted (a fault is the family's driver error)."""


@runtime_checkable
class Driver(Protocol):
    """Devices, contexts, raw memory, modules and queues.  Errors carry the family's driver
    code; a fault the family makes sticky leaves its context unusable until destroyed, one
    that loses the device fails every call until :meth:`reset`.  ``counts``, ``kernel_log``,
    ``module_load_s`` and ``managed_migration_s`` are the statistics the report reads."""

    vendor: str
    #: cumulative event counts (launches, copies, bytes per direction, allocations, ...);
    #: they only grow, except by a new driver
    counts: dict[str, int]
    #: one record per kernel that ran, oldest first (a bounded log keeps a ``total``)
    kernel_log: list[KernelRecord]
    #: simulated seconds spent building modules (JIT and IL builds), failed builds included
    module_load_s: float
    #: simulated seconds spent migrating managed memory (faults, prefetches, host touches)
    managed_migration_s: float
    #: the simulated devices this driver drives, by device index (read-only to callers)
    devices: list[Device]
    #: the family's API name for each of its calls (``allocate`` -> ``cuMemAlloc``);
    #: errors name the call this way
    calls: dict[str, str]
    #: the family's driver error codes: every error this driver raises comes from it
    errors: ErrorTable
    #: which context a call without one uses: "thread" (a per-thread current stack),
    #: "device" (the thread's device's primary context) or "explicit" (none: it is an error)
    context_rule: str
    #: fault kinds (:class:`~fornax.sim.faults.SimError` ``kind``) that make the faulting
    #: context sticky: every later call in it fails until it is destroyed or the device reset
    sticky_conditions: set[str]
    #: fault kinds that lose the whole device: every call on it fails until :meth:`reset`
    lost_conditions: set[str]

    def device_count(self) -> int:
        """How many devices this driver sees."""
    def properties(self, index: int) -> DeviceProperties:
        """Device ``index``'s properties; raises ``invalid_device`` out of range."""
    def memory_info(self, index: int) -> tuple[int, int]:
        """(free, total) bytes of device ``index``'s memory."""
    def loadable_formats(self, index: int) -> tuple[str, ...]:
        """The binary formats :meth:`load_module` accepts for device ``index``."""
    def create_context(self, index: int) -> Context:
        """A new context on device ``index`` (the caller owns it until
        :meth:`destroy_context`); raises when the device is lost."""
    def destroy_context(self, ctx: Context) -> None:
        """Destroy ``ctx`` with every allocation, module and queue in it (work already
        submitted still runs).  Raises ``invalid_context`` if already destroyed."""
    def allocate(self, ctx: Context, nbytes: int, kind: str = "device") -> int:
        """Map ``nbytes`` (> 0) of ``kind`` memory ("device", "host_pinned", "managed") in
        ``ctx``; its device address.  Raises ``out_of_memory`` or ``invalid_value``."""
    def free(self, ctx: Context, address: int) -> None:
        """Unmap the allocation starting at ``address`` at once (no synchronisation)."""
    def load_module(self, ctx: Context, binary: KernelBinary) -> Module:
        """Load ``binary`` into ``ctx`` by its format's load rule (exact, virtual JIT, IL
        build, bundle); raises ``unsupported_format``, ``no_binary_for_device`` or a build
        failure carrying ``build_log``."""
    def host_read(self, ctx: Context, address: int, nbytes: int) -> bytes:
        """The host reads managed or host-pinned memory (committed state: synchronise first)."""
    def host_write(self, ctx: Context, address: int, data: HostData) -> None:
        """The host writes managed or host-pinned memory."""
    def create_queue(self, ctx: Context, priority: int = 0) -> Queue:
        """A new queue in ``ctx``, owned by the caller until :meth:`destroy_queue`;
        ``priority`` (lower first, already within the family's range) orders its work
        against other queues' when both are ready for the same engine."""
    def synchronize(self, ctx: Context) -> None:
        """The host waits for all work of ``ctx``'s device; raises a fault of any of the
        context's queues."""
    def can_access_peer(self, index: int, peer: int) -> bool:
        """Whether device ``index`` can reach device ``peer``'s memory over a fabric."""
    def enable_peer_access(self, ctx: Context, peer_ctx: Context) -> None:
        """Let ``ctx`` access ``peer_ctx``'s memory (one direction); ``not_supported`` where
        the family has no such call (access follows :meth:`can_access_peer`)."""
    def report(self) -> dict[str, Any]:
        """This driver's part of the run report (JSON-serialisable)."""
    def destroy_queue(self, queue: Queue) -> None:
        """Release ``queue``; work already submitted still runs.  Later use is an error."""
    def unload_module(self, module: Module) -> None:
        """Unload ``module``: its kernels can no longer be launched (submitted work runs)."""
    def handles(self) -> dict[str, int]:
        """Live handles by kind (contexts, queues, modules, mappings); all zero once
        everything is released."""
    def is_lost(self, index: int) -> bool:
        """Whether device ``index`` is lost (every call fails until :meth:`reset`)."""
    def reset(self, index: int) -> None:
        """Reset device ``index``: destroy every context on it and clear its lost state."""
    def pop_current(self) -> Context:
        """Pop the calling thread's current context (cuCtxPopCurrent).  Raises
        ``not_supported`` where the family has no current context (``context_rule``
        "explicit") and ``invalid_context`` when the thread's stack is empty."""
    def target(self, index: int) -> str:
        """The device's arch name in the family's vocabulary (sm_90, gfx942, ...)."""
    def device_spec(self, index: int) -> ChipSpec:
        """The simulated chip spec behind device ``index``."""
    def managed_policy(self, device: Device) -> str:
        """How kernels reach managed memory: "migrate" or "remote"."""
    def media_engines(self, index: int) -> list[MediaEngine]:
        """Device ``index``'s media (video decode) engines from its chip spec, one per
        physical engine; empty where the chip has none."""
    def create_media_queue(self, ctx: Context | None, codec: str, width: int, height: int,
                           host_decoder: Callable[[bytes], NDArray[Any]] | None = None) -> MediaQueue:
        """A decode session in ``ctx`` for ``codec`` frames up to ``width x height``, through
        the family's decode API (``[driver.media]``: cuvidCreateDecoder, rocDecCreateDecoder,
        MFXVideoDECODE_Init, ...), bound to the least-loaded engine of the kind that decodes
        ``codec``.  ``host_decoder`` turns one compressed frame into its pixels (default:
        fornax's own for the codec; mjpeg has one).  A codec no engine decodes, a size beyond
        the engine's, or more sessions than the engine kind holds raise the family's
        not-supported code (CUDA_ERROR_NOT_SUPPORTED, hipErrorNotSupported,
        ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)."""
    def destroy_media_queue(self, queue: MediaQueue) -> None:
        """End a decode session; decodes already submitted still land.  Later use is an error."""


@runtime_checkable
class FaultMapping(Protocol):
    """The capability to map a simulator fault raised while waiting on a context's work to
    the family's driver error (applying its sticky and lost rules), as
    :class:`~fornax.layers.driver.base.DriverBase` does."""

    def fault(self, ctx: Context, exc: SimError, call: str) -> FornaxError:
        """The family's error for ``exc`` raised by ``call`` in ``ctx``; makes ``ctx`` sticky
        or its device lost where the family does so for that fault."""

