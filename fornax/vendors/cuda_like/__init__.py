"""The cuda-like vendor family."""

from ...layers.vendor import Vendor, load_facts

FACTS = load_facts(__name__)

from .compiler import CudaLikeCompiler  # noqa: E402
from .driver import CudaLikeDriver  # noqa: E402
from .framework import CudaLikeFramework  # noqa: E402
from .library import CudaLikeLibrary  # noqa: E402
from .runtime import CudaLikeRuntime  # noqa: E402

VENDOR = Vendor(FACTS["name"], FACTS["description"], FACTS, CudaLikeDriver, CudaLikeRuntime,
                CudaLikeLibrary, CudaLikeCompiler, CudaLikeFramework)
