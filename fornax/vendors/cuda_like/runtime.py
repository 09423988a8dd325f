"""cuda-like runtime: cudaMalloc/cudaFree, cudaStream_t, async copies."""

from __future__ import annotations

from ...layers.runtime import RuntimeBase
from .facts import FACTS
from .profiler import CuptiLikeProfiler


class CudaLikeRuntime(RuntimeBase):
    vendor = FACTS["name"]
    facts = FACTS
    profiler_class = CuptiLikeProfiler
