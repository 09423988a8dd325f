"""Profiling hooks: one shared collector fed by the runtime and driver seams, and what the
families' profiling interfaces build on.

- :mod:`.collector`: :class:`Collector`, attached to a driver only while a client
  subscribes; API calls (enter/exit, correlation ids) and device work (kernels, copies);
- :mod:`.records`: :class:`ApiRecord`, :class:`KernelActivity`, :class:`CopyActivity`;
- :mod:`.metrics`: hardware-counter-like metrics of a kernel from the cost model;
- :mod:`.vocabulary`: a family's names (``[profiler]`` of its ``vendor.toml``);
- :mod:`.buffer`: client-provided activity buffers, dropped-record counts;
- :mod:`.base`: :class:`ProfilerBase` and :class:`Client`, what a family's interface
  (``fornax/vendors/<family>/profiler.py``) is written with;
- :mod:`.recorder`: :class:`Recorder`, a bounded client for `fornax profile`, traces and
  torch.profiler;
- :mod:`.summary`: the nsys / rocprof / unitrace-like summary of a recording.
"""

from __future__ import annotations

from .base import Client, ProfilerBase
from .buffer import ActivityBuffers
from .collector import Collector
from .metrics import KEYS as METRIC_KEYS
from .metrics import kernel_metrics
from .records import ApiRecord, CopyActivity, KernelActivity
from .recorder import Recorder
from .vocabulary import Vocabulary, api_base

__all__ = ["METRIC_KEYS", "ActivityBuffers", "ApiRecord", "Client", "Collector", "CopyActivity",
           "KernelActivity", "ProfilerBase", "Recorder", "Vocabulary", "api_base", "kernel_metrics"]
