"""The host BLAS under the simulator's fast paths: one thread while a fast path multiplies.

A fast path's products are many small matrix products of one launch (a ``(m x 16) @ (16 x
n)`` slab per K step, a batch of tile products).  numpy's OpenBLAS splits a product that
size over its threads, and on a small, shared host (two cores, where the simulator's own
thread and the framework's compete for them) the split can stall for the scheduler's whole
time slice: a 40 µs product took 10-16 ms, and one launch's products up to a hundred times
their single-threaded time.  :func:`one_thread` runs its block with numpy's BLAS on one
thread and gives back the caller's setting after it (``threadpoolctl``; a few µs when the
setting changes, nothing when it is already one), so what a user's own numpy code does
outside a fast path is untouched.  The bits do not depend on the thread count: each
element's sum is one thread's in either case (checked by ``tests/sim/test_gemm_fastpath.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_controllers: list[Any] | None = None


def _blas() -> list[Any]:
    """The thread controllers of the BLAS libraries numpy loaded (found once)."""
    global _controllers
    if _controllers is None:
        from threadpoolctl import ThreadpoolController
        _controllers = list(ThreadpoolController().select(user_api="blas").lib_controllers)
    return _controllers


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with the host BLAS on one thread; the previous setting after it."""
    changed = []
    for lib in _blas():
        n = lib.get_num_threads()
        if n is not None and n != 1:
            lib.set_num_threads(1)
            changed.append((lib, n))
    try:
        yield
    finally:
        for lib, n in changed:
            lib.set_num_threads(n)
