"""cuda-like framework face: device "cuda", torch.version.cuda, dist backend "nccl"."""

from __future__ import annotations

from ...layers.framework import FrameworkBase
from .facts import FACTS


class CudaLikeFramework(FrameworkBase):
    vendor = FACTS["name"]
    facts = FACTS
