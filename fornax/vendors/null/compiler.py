"""null compiler: the Compiler protocol with nothing implemented."""

from __future__ import annotations

from .driver import not_implemented
from .facts import FACTS


class NullCompiler:
    """Graph IR in, kernel binaries and a launch plan out — to be written."""

    vendor = FACTS["name"]
    compile_wall_s = 0.0          # host seconds spent compiling (the report shows it)

    def output_formats(self):
        raise not_implemented("compiler.output_formats")

    def compile(self, graph, target, library_routines=frozenset()):
        raise not_implemented("compiler.compile")

    def report(self):
        raise not_implemented("compiler.report")

    def unsupported(self, graph, library_routines=frozenset()):
        raise not_implemented("compiler.unsupported")
