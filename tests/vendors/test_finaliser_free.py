"""A free reached from inside a running packet (a finaliser the garbage collector runs while
the simulator executes a kernel) must not re-enter the timeline: the runtime defers it and
carries it out at its next call (issue 15's reentrancy crash, seen on blocking frees)."""

from __future__ import annotations

import pytest

from fornax.sim.device import Device
from fornax.sim.spec import load_spec
from fornax.sim.timeline import Packet
from fornax.stack import get_vendor

VENDORS = ("cuda-like", "rocm-like", "xpu-like")


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_free_from_inside_a_packet_is_deferred_and_then_done(vendor):
    rt = get_vendor(vendor).runtime(get_vendor(vendor).driver([Device(load_spec("tiny"), 0)]))
    keep = rt.malloc(4096)
    doomed = rt.malloc(4096)
    tl = rt.driver.devices[0].timeline
    q = tl.create_queue("finaliser")
    seen = []

    def work():
        rt.free(doomed)                          # what a weakref.finalize callback would do
        seen.append(list(rt._deferred_frees))
        return 1e-6
    q.submit(Packet("compute", work, label="kernel-with-a-finaliser"))
    tl.drain()
    assert seen == [[doomed]]                    # not freed (nor synchronised) inside the step
    assert tl.stepping == 0
    rt.synchronize()                             # the next runtime call frees it
    assert rt._deferred_frees == []
    again = rt.malloc(4096)
    assert again == doomed                       # the block really went back to the allocator
    rt.free(again)
    rt.free(keep)
