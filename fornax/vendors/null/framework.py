"""null framework: the Framework protocol with nothing implemented."""

from __future__ import annotations

from .driver import not_implemented
from .facts import FACTS


class NullFramework:
    """The family's face to PyTorch/JAX and its op routing — to be written."""

    vendor = FACTS["name"]

    #: shape-only mode, set at compose time
    meta = False
    #: whether resident plans capture and replay their runtime calls, set at compose time
    capture_plans = True
    #: the PyTorch face: fornax.layers.face.parse_torch_face over vendor.toml [framework.torch]
    torch_face = None

    def __init__(self, compiler, library, runtime, target):
        self.compiler, self.library, self.runtime, self.target = compiler, library, runtime, target

    def device_route(self, graph):
        raise not_implemented("framework.device_route")

    def prepare(self, graph, stream=None):
        raise not_implemented("framework.prepare")

    @property
    def face(self):
        raise not_implemented("framework.face")

    def route(self, op):
        raise not_implemented("framework.route")

    def torch_route(self, op):
        raise not_implemented("framework.torch_route")

    def device_properties(self, driver, index=0):
        raise not_implemented("framework.device_properties")

    def versions(self):
        raise not_implemented("framework.versions")

    def autocast_policy(self):
        raise not_implemented("framework.autocast_policy")

    def run(self, graph, feeds):
        raise not_implemented("framework.run")

    def report(self):
        raise not_implemented("framework.report")
