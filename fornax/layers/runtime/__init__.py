"""The runtime seam: what frameworks call.

Current device, streams/queues, events, a caching device allocator, a pinned
host pool, synchronous and asynchronous copies, a module cache, launches and
graph capture/replay — on top of any driver, through the
:class:`~fornax.layers.driver.Driver` protocol only.  The policy is written
once here, one concern per module (:mod:`.protocol` the contract,
:mod:`.handles` streams, events and graphs, :mod:`.core`, :mod:`.streams`,
:mod:`.events`, :mod:`.memory` with :mod:`.host_pool`, :mod:`.graphs`,
:mod:`.copies`, :mod:`.modules`, assembled in :mod:`.base`); the families
differ in data (``vendor.toml`` ``[runtime]``):

- ``default_stream``: ``legacy`` (the NULL stream of CUDA and HIP, which
  waits for prior work of every blocking stream and makes every blocking
  stream wait for it) or ``in_order`` (an ordinary in-order queue, as
  torch.xpu's current stream is);
- ``queue_order``/``queue_pool``: what ``create_stream()`` gives by default —
  an in-order stream, or a SYCL-like out-of-order queue whose commands run on
  a pool of driver queues and are ordered only by ``depends_on`` events;
- ``per_thread_supported``/``per_thread_default_stream``: the per-thread
  default stream (cudaStreamPerThread, hipStreamPerThread);
- ``blocking`` and ``[runtime.sync_copy]``: which calls block the host and
  when a synchronous copy returns;
- ``event_timing``/``elapsed_incomplete``: who enables event timing (an event
  flag, or the queue's profiling property) and what an elapsed-time query on
  unfinished work does;
- ``pageable_host_rate``: the share of the host link a pageable copy reaches;
- ``[runtime.graph]``: whether captured graphs exist and what a graph node's
  launch costs relative to a stream launch.

Implicit orderings are record/wait markers on the driver queues, so the
timeline and the race detector see exactly the ordering the family promises.
"""

from __future__ import annotations

from .base import RuntimeBase
from .handles import BLOCKING, NON_BLOCKING, Event, Graph, GraphLauncher, GraphNode, Stream
from .host_pool import PinnedHostPool, PoolOwner
from .protocol import Runtime

__all__ = ["BLOCKING", "NON_BLOCKING", "Event", "Graph", "GraphLauncher", "GraphNode",
           "PinnedHostPool", "PoolOwner", "Runtime", "RuntimeBase", "Stream"]
