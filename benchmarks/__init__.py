"""fornax benchmarks (run with `make bench`; never part of the test suite)."""

import time

REPEATS = 5


def best(fn, repeats: int = REPEATS) -> float:
    """The best wall time of ``repeats`` calls of ``fn``, in seconds."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
