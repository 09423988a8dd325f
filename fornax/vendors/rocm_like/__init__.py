"""The rocm-like vendor family."""

from ...layers.vendor import Vendor, load_facts

FACTS = load_facts(__name__)

from .compiler import RocmLikeCompiler  # noqa: E402
from .driver import RocmLikeDriver  # noqa: E402
from .framework import RocmLikeFramework  # noqa: E402
from .library import RocmLikeLibrary  # noqa: E402
from .runtime import RocmLikeRuntime  # noqa: E402

VENDOR = Vendor(FACTS["name"], FACTS["description"], FACTS, RocmLikeDriver, RocmLikeRuntime,
                RocmLikeLibrary, RocmLikeCompiler, RocmLikeFramework)
