"""Collectives (NCCL/RCCL/oneCCL-like): a communicator over several simulated devices.

**Data really moves.**  Every collective is a schedule of peer copies
(``QueueBase.copy_peer``) and small pointwise kernels (``out = a op b``, built
with the ISA and shipped in the library's own image format) on the ranks'
queues, ordered by markers across devices; **time** comes from executing
that schedule: every copy is priced by the topology's alpha-beta model on
its link, every kernel by the cost model, and the packets of all ranks run
in one simulated-time order.

One noun per module:

* :mod:`.communicator` — :class:`Communicator` (ranks, buffers, call
  matching, the watchdog), :class:`RankComm` (one rank's calls) and
  :class:`Work` (a call's handle);
* :mod:`.calls` — :class:`~.calls.Call`, what a rank posted, and the
  collective and reduction names;
* :mod:`.algorithms` — ring or tree (:func:`~.algorithms.choose`) and the
  schedule each collective builds, with its summation order;
* :mod:`.schedule` — :class:`~.schedule.Schedule`: the copies and kernels of
  one collective and their cross-device ordering, run to completion;
* :mod:`.kernels` — the reduction kernels (``combine``, ``div``);
* :mod:`.record` — :class:`CollectiveRecord` and nccl-tests' bus-bandwidth
  factors (:data:`BUS_FACTOR`).
"""

from __future__ import annotations

from .calls import COLLECTIVES, REDUCTIONS, Call
from .communicator import CollectiveLibrary, Communicator, RankComm, Work
from .record import BUS_FACTOR, CollectiveRecord
from .schedule import Schedule, ScheduleHost

__all__ = ["BUS_FACTOR", "COLLECTIVES", "REDUCTIONS", "Call", "CollectiveLibrary", "CollectiveRecord",
           "Communicator", "RankComm", "Schedule", "ScheduleHost", "Work"]
