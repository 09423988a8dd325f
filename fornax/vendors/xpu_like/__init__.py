"""The xpu-like vendor family."""

from ...layers.vendor import Vendor, load_facts

FACTS = load_facts(__name__)

from .compiler import XpuLikeCompiler  # noqa: E402
from .driver import XpuLikeDriver  # noqa: E402
from .framework import XpuLikeFramework  # noqa: E402
from .library import XpuLikeLibrary  # noqa: E402
from .runtime import XpuLikeRuntime  # noqa: E402

VENDOR = Vendor(FACTS["name"], FACTS["description"], FACTS, XpuLikeDriver, XpuLikeRuntime,
                XpuLikeLibrary, XpuLikeCompiler, XpuLikeFramework)
