"""A free reached from inside a running packet (a finaliser the garbage collector runs while
the simulator executes a kernel) must not re-enter the timeline: the runtime defers it and
carries it out at its next call (issue 15's reentrancy crash, seen on blocking frees)."""

from __future__ import annotations

import pytest

from fornax.sim.device import Device
from fornax.sim.spec import load_spec
from fornax.sim.timeline import Packet
from fornax.stack import get_vendor
from helpers import FAMILIES

VENDORS = FAMILIES


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


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_synchronising_finaliser_while_a_packet_is_built_does_not_hang(vendor, monkeypatch):
    """The garbage collector can run a finaliser (a compiled plan's release: a blocking free)
    while a queue builds the packet of a launch or copy; the synchronise it does must not
    wait for that packet, which is not on the hardware queue yet."""
    import numpy as np

    from fornax.layers.driver import queue as driver_mod
    rt = get_vendor(vendor).runtime(get_vendor(vendor).driver([Device(load_spec("tiny"), 0)]))
    ptr = rt.malloc(4096)
    real = driver_mod.Packet
    fired = []

    def packet_with_a_finaliser(*args, **kwargs):
        if not fired:
            fired.append(True)
            rt.synchronize()                     # what free -> synchronise does from a finaliser
        return real(*args, **kwargs)
    monkeypatch.setattr(driver_mod, "Packet", packet_with_a_finaliser)
    host = np.arange(1024, dtype=np.float32)
    rt.memcpy_h2d(ptr, host.view(np.uint8), None)
    rt.synchronize()
    back = np.empty(4096, dtype=np.uint8)
    rt.memcpy_d2h(back, ptr, None, blocking=True)
    assert fired and np.array_equal(back.view(np.float32), host)
    rt.free(ptr)
