"""Whatever a careless caller passes to the driver or runtime, the answer is the vendor's coded error."""

from __future__ import annotations

import numpy as np
import pytest

from fornax.layers.errors import FornaxError
from fornax.sim.device import Device
from fornax.sim.spec import load_spec
from fornax.stack import get_vendor
from helpers import FAMILIES

VENDORS = FAMILIES


def _stack(vendor):
    v = get_vendor(vendor)
    drv = v.driver([Device(load_spec("tiny"), 0)])
    return drv, v.runtime(drv)


CASES = {
    "runtime launch of None": lambda d, rt: rt.launch(None, "k", (1, 1, 1), {}),
    "memcpy to a string address": lambda d, rt: rt.memcpy_h2d("x", np.zeros(4)),
    "memcpy to an unmapped address": lambda d, rt: rt.memcpy_h2d(12345, np.zeros(4)),
    "memcpy from a list": lambda d, rt: rt.memcpy_h2d(rt.malloc(64), [1, 2]),
    "memcpy from an unmapped address": lambda d, rt: rt.memcpy_d2h(np.zeros(4), 999),
    "memcpy into a list": lambda d, rt: rt.memcpy_d2h([1, 2], rt.malloc(16)),
    "runtime free of a string": lambda d, rt: rt.free("abc"),
    "runtime double free": lambda d, rt: [rt.free(p) for p in [rt.malloc(8)] * 2],
    "record on a non-stream": lambda d, rt: rt.record_event(123),
    "wait on a non-event": lambda d, rt: rt.stream_wait_event(None, 5),
    "load of raw bytes": lambda d, rt: rt.load_module(b"x"),
    "malloc of a float": lambda d, rt: rt.malloc(1.5),
    "driver free of a string": lambda d, rt: d.free(d.create_context(0), "x"),
    "driver load of None": lambda d, rt: d.load_module(d.create_context(0), None),
    "queue copy to a string": lambda d, rt: d.create_queue(d.create_context(0)).copy_h2d("x", np.zeros(3)),
    "queue wait on None": lambda d, rt: d.create_queue(d.create_context(0)).wait(None),
    "queue launch of None": lambda d, rt: d.create_queue(d.create_context(0)).launch(None, "k", (1,), {}),
    "negative copy size": lambda d, rt: d.create_queue(d.create_context(0)).copy_d2d(0, 0, -1),
    "use after destroy": lambda d, rt: [d.destroy_context(c) or d.allocate(c, 8) for c in [d.create_context(0)]],
}


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_handle_gives_a_coded_error(vendor, case):
    drv, rt = _stack(vendor)
    with pytest.raises(FornaxError) as info:
        CASES[case](drv, rt)
    err = info.value
    assert err.code is not None, f"{case}: {err} carries no vendor code"
    assert err.vendor == vendor and err.seam in ("driver", "runtime")
