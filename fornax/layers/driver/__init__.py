"""The driver seam: devices, contexts, raw memory, modules, queues, launch.

:class:`Driver` and :class:`Queue` are the Protocols the runtime seam calls
(:mod:`.protocol`, with the handles that cross the seam).  :class:`DriverBase`
(:mod:`.base`) and :class:`QueueBase` (:mod:`.queue`) hold the policy every
family shares, one concern per module: the core state and fault rules
(:mod:`.core`), contexts and the current-context rules (:mod:`.context`),
allocation, peer access and managed memory (:mod:`.memory`, :mod:`.managed`),
module loading by format rule and bundles (:mod:`.module`), decode sessions on
the media engines (:mod:`.media`), and the kernel log the report reads
(:mod:`.kernel_log`).  A vendor supplies its facts
(``vendor.toml``: API call names, error codes, formats and their load rules,
arch names) and small hooks: how to decode its binary container, how its
queues put work on the hardware (streams, AQL packets, command lists), and
how it describes a device in its own vocabulary.
"""

from __future__ import annotations

from .base import DriverBase
from .core import DriverCore, is_int
from .kernel_log import KernelLog, KernelRecord
from .managed import ManagedRegion
from .media import HOST_DECODERS, HostDecoder, MediaQueueBase, decode_jpeg
from .module import arch_number
from .protocol import (Context, DeviceProperties, Driver, FaultMapping, HostArray, HostData,
                       KernelArgs, Marker, MediaEngine, MediaQueue, Module, Queue,
                       ShapeOnlyArray)
from .queue import QueueBase

__all__ = ["HOST_DECODERS", "Context", "DeviceProperties", "Driver", "DriverBase", "DriverCore",
           "FaultMapping", "HostArray", "HostData", "HostDecoder", "KernelArgs", "KernelLog",
           "KernelRecord", "ManagedRegion", "Marker", "MediaEngine", "MediaQueue", "MediaQueueBase",
           "Module", "Queue", "QueueBase", "ShapeOnlyArray", "arch_number", "decode_jpeg", "is_int"]
