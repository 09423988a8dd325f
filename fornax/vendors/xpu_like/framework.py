"""xpu-like framework face: device "xpu", torch.xpu, torch.version.xpu, dist backend "xccl"."""

from __future__ import annotations

from ...layers.framework import FrameworkBase
from .facts import FACTS


class XpuLikeFramework(FrameworkBase):
    vendor = FACTS["name"]
    facts = FACTS
