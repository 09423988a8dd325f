"""Runtime modules and launches: the module cache keyed by (device, binary digest),
unloading, and kernel launches on a stream."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..binary import KernelBinary
from ..driver import KernelArgs, Module
from .graphs import GraphCapture
from .handles import Event, Stream


class ModuleCache(GraphCapture):
    """The module cache and launches."""

    def load_module(self, binary: KernelBinary) -> Module:
        if not isinstance(binary, KernelBinary):
            raise self._error(f"expected a KernelBinary, got {type(binary).__name__}", "load_module")
        key = (self._device, binary.digest)
        module = self._modules.get(key)
        if module is not None:
            self.counts["module_cache_hits"] += 1
            return module
        module = self.driver.load_module(self.context(), binary)
        self._modules[key] = module
        self.counts["module_loads"] += 1
        return module

    def unload_module(self, module: Module) -> None:
        """Drop a module from the runtime's cache and unload it from the driver
        (cudaLibraryUnload / hipModuleUnload / a kernel bundle's release)."""
        key = next((k for k, m in self._modules.items() if m is module), None)
        if key is None:
            raise self._error("not a module this runtime loaded, or already unloaded",
                              "unload_module", condition="invalid_handle")
        del self._modules[key]
        self.driver.unload_module(module)

    def launch(self, module: Module, entry: str, grid: Sequence[int], args: KernelArgs,
               stream: Stream | None = None, depends_on: Iterable[Event] = ()) -> Event:
        """Launch a kernel on a stream (after ``depends_on`` events); returns its event."""
        s = self._stream(stream)
        self.counts["launches"] += 1
        if s.capture is not None:
            return self._capture_node(s, ("launch", module, entry, tuple(grid), dict(args)))
        q = self._before(s, depends_on)
        q.launch(module, entry, grid, args)
        return self._after(s, q)
