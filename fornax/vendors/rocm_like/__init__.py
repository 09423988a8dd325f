"""The rocm-like vendor family."""

from ...layers.vendor import Vendor
from .facts import FACTS

from .compiler import RocmLikeCompiler
from .driver import RocmLikeDriver
from .framework import RocmLikeFramework
from .library import RocmLikeLibrary
from .runtime import RocmLikeRuntime

VENDOR = Vendor(FACTS["name"], FACTS["description"], FACTS, RocmLikeDriver, RocmLikeRuntime,
                RocmLikeLibrary, RocmLikeCompiler, RocmLikeFramework)
