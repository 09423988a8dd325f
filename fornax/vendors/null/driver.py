"""null driver: the Driver protocol with nothing implemented."""

from __future__ import annotations

from ...layers.errors import NotSupportedError


def not_implemented(hook: str) -> NotSupportedError:
    return NotSupportedError(f"not implemented: {hook}", seam=hook.split(".")[0], vendor="null",
                             hint="the null vendor is a template; implement this hook")


class NullDriver:
    """Devices, contexts, memory, modules and queues — to be written."""

    vendor = "null"

    def __init__(self, devices):
        self.devices = list(devices)

    def device_count(self):
        raise not_implemented("driver.device_count")

    def properties(self, index):
        raise not_implemented("driver.properties")

    def memory_info(self, index):
        raise not_implemented("driver.memory_info")

    def loadable_formats(self, index):
        raise not_implemented("driver.loadable_formats")

    def create_context(self, index):
        raise not_implemented("driver.create_context")

    def destroy_context(self, ctx):
        raise not_implemented("driver.destroy_context")

    def allocate(self, ctx, nbytes, kind="device"):
        raise not_implemented("driver.allocate")

    def free(self, ctx, address):
        raise not_implemented("driver.free")

    def load_module(self, ctx, binary):
        raise not_implemented("driver.load_module")

    def host_read(self, ctx, address, nbytes):
        raise not_implemented("driver.host_read")

    def host_write(self, ctx, address, data):
        raise not_implemented("driver.host_write")

    def create_queue(self, ctx):
        raise not_implemented("driver.create_queue")

    def synchronize(self, ctx):
        raise not_implemented("driver.synchronize")

    def report(self):
        raise not_implemented("driver.report")

    def destroy_queue(self, queue):
        raise not_implemented("driver.destroy_queue")

    def unload_module(self, module):
        raise not_implemented("driver.unload_module")

    def handles(self):
        raise not_implemented("driver.handles")

    def is_lost(self, index):
        raise not_implemented("driver.is_lost")

    def reset(self, index):
        raise not_implemented("driver.reset")
