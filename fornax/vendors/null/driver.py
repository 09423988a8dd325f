"""null driver: the Driver protocol with nothing implemented."""

from __future__ import annotations

from fornax.layers.errors import ErrorTable, NotSupportedError
from .facts import FACTS


def not_implemented(hook: str) -> NotSupportedError:
    """The error every template hook raises: which hook, where to write it, where its facts go."""
    seam, _, name = hook.partition(".")
    return NotSupportedError(
        f"not implemented: {hook}", seam=seam, vendor=FACTS["name"], op=name,
        hint=f"the null vendor is a template: implement {name}() in your package's {seam}.py "
             f"(the contract is fornax.layers.{seam}.{seam.capitalize()}; the family's facts "
             f"live in vendor.toml [{seam}]); docs/new-vendor.md walks through it")


class NullDriver:
    """Devices, contexts, memory, modules and queues — to be written."""

    vendor = FACTS["name"]

    def __init__(self, devices):
        self.devices = list(devices)
        # the statistics the report reads (fill them as the hooks below do their work)
        self.counts: dict = {}
        self.kernel_log: list = []
        self.module_load_s = 0.0
        self.managed_migration_s = 0.0
        # the family's vocabulary and policy, from vendor.toml: [driver.calls] (call -> API
        # name), [errors] (codes; fornax.layers.errors.ErrorTable), [driver.contexts] current
        self.calls: dict = {}
        self.errors = ErrorTable(FACTS["name"], {}, {}, seam="driver", vendor=FACTS["name"])
        self.context_rule = "explicit"
        self.sticky_conditions: set = set()      # faults that poison a context ([errors] sticky)
        self.lost_conditions: set = set()        # faults that lose the device ([errors] lost)

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

    def pop_current(self):
        raise not_implemented("driver.pop_current")

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

    def create_queue(self, ctx, priority=0):
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

    def can_access_peer(self, index, peer):
        raise not_implemented("driver.can_access_peer")

    def device_spec(self, index):
        raise not_implemented("driver.device_spec")

    def enable_peer_access(self, ctx, peer_ctx):
        raise not_implemented("driver.enable_peer_access")

    def managed_policy(self, device):
        raise not_implemented("driver.managed_policy")

    def target(self, index):
        raise not_implemented("driver.target")

    def media_engines(self, index):
        raise not_implemented("driver.media_engines")

    def create_media_queue(self, ctx, codec, width, height, host_decoder=None):
        raise not_implemented("driver.create_media_queue")

    def destroy_media_queue(self, queue):
        raise not_implemented("driver.destroy_media_queue")
