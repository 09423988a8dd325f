"""rocm-like runtime (HIP): hipMalloc/hipFree block the host, hipStream_t over AQL queues."""

from __future__ import annotations

from ...layers.runtime import RuntimeBase
from .facts import FACTS
from .profiler import RocprofilerLikeProfiler


class RocmLikeRuntime(RuntimeBase):
    vendor = FACTS["name"]
    facts = FACTS
    profiler_class = RocprofilerLikeProfiler
