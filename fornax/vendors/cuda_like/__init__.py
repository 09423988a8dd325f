"""The cuda-like vendor family."""

from ...layers.vendor import Vendor
from .facts import FACTS

from .compiler import CudaLikeCompiler
from .driver import CudaLikeDriver
from .framework import CudaLikeFramework
from .library import CudaLikeLibrary
from .runtime import CudaLikeRuntime

VENDOR = Vendor(FACTS["name"], FACTS["description"], FACTS, CudaLikeDriver, CudaLikeRuntime,
                CudaLikeLibrary, CudaLikeCompiler, CudaLikeFramework)
