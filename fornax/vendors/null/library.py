"""null library: the Library protocol with nothing implemented."""

from __future__ import annotations

from .driver import not_implemented


class NullLibrary:
    """Named routines (GEMM, ...) on top of a runtime — to be written."""

    vendor = "null"
    name = "null-library"

    def __init__(self, runtime):
        self.runtime = runtime

    def formats(self):
        raise not_implemented("library.formats")

    def ops(self):
        raise not_implemented("library.ops")

    def gemm(self, a, b, c, params, stream=None):
        raise not_implemented("library.gemm")

    def report(self):
        raise not_implemented("library.report")
