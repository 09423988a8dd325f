"""The null template vendor: the documented starting point for a new family.

Every method of every seam raises ``NotSupportedError("not implemented:
SEAM.HOOK")``.  Copy this package, rename it, and replace the methods one by
one; ``fornax conform driver --impl yourpkg:VENDOR`` tells you, clause by
clause, what still fails.  (Most families will rather subclass the shared
bases in ``fornax.layers`` as the built-in families do, and only fill in
their hooks and ``vendor.toml``.)
"""

from fornax.layers.vendor import Vendor
from .facts import FACTS

from .compiler import NullCompiler
from .driver import NullDriver
from .framework import NullFramework
from .library import NullLibrary
from .runtime import NullRuntime

VENDOR = Vendor(FACTS["name"], FACTS["description"], FACTS, NullDriver, NullRuntime,
                NullLibrary, NullCompiler, NullFramework)
