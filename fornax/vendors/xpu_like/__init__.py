"""The xpu-like vendor family."""

from ...layers.vendor import Vendor
from .facts import FACTS

from .compiler import XpuLikeCompiler
from .driver import XpuLikeDriver
from .framework import XpuLikeFramework
from .library import XpuLikeLibrary
from .runtime import XpuLikeRuntime

VENDOR = Vendor(FACTS["name"], FACTS["description"], FACTS, XpuLikeDriver, XpuLikeRuntime,
                XpuLikeLibrary, XpuLikeCompiler, XpuLikeFramework)
