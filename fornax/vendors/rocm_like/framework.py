"""rocm-like framework face: the "cuda" device and torch.cuda (HIP poses as CUDA), torch.version.hip."""

from __future__ import annotations

from ...layers.framework import FrameworkBase
from .facts import FACTS


class RocmLikeFramework(FrameworkBase):
    vendor = FACTS["name"]
    facts = FACTS
