"""xpu-like runtime (SYCL): USM device allocations, in-order sycl::queue over immediate command lists."""

from __future__ import annotations

from ...layers.runtime import RuntimeBase
from .facts import FACTS
from .profiler import ZelTracerLikeProfiler


class XpuLikeRuntime(RuntimeBase):
    vendor = FACTS["name"]
    facts = FACTS
    profiler_class = ZelTracerLikeProfiler
