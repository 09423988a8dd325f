"""The reference solution of lab 3, exercise 3.5 (for the tests; fornax lab never prints it):
the reader's stream waits for an event recorded on the writer's stream after the kernel."""

from typing import Any

import numpy as np


def run(runtime: Any, module: Any, src: int, dst: int, n: int) -> np.ndarray:
    writer = runtime.create_stream(in_order=True)
    reader = runtime.create_stream(in_order=True)
    runtime.launch(module, "scale3", (1, 1, 1), {"src": src, "dst": dst}, writer)
    done = runtime.record_event(writer)           # completes when the kernel has
    runtime.stream_wait_event(reader, done)       # the reader's later work waits for it
    out = np.zeros(n, np.float32)
    runtime.memcpy_d2h(out, dst, reader, blocking=False)
    runtime.synchronize()
    return out
