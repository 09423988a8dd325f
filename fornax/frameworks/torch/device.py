"""``torch.fornax``: the device module of the ``fornax`` device, shaped like ``torch.cuda`` /
``torch.xpu``.

What it reports comes from the active stack (:mod:`.session`): device properties and
version fields in the framework seam's vocabulary (a cuda-like stack shows a CUDA face,
rocm-like the same face with a HIP version, xpu-like its own), memory statistics
from the runtime seam's caching allocator, streams and events from the runtime seam.
Only device index 0 is addressable on PyTorch's pure-Python backend route.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from . import session as _session
from .device_index import device_index
from .session import DeviceError, use_stack  # noqa: F401  (public: torch.fornax.use_stack)
from .streams import Event, Stream, current_stream, default_stream, set_stream, stream  # noqa: F401

_initialized = False


def _current():
    global _initialized
    s = _session.current()
    _initialized = True
    return s


# -- the hooks PyTorch calls ------------------------------------------------------------------
def is_available() -> bool:
    return True


def is_initialized() -> bool:
    # the device is initialised once its stack is composed (by any first use: a tensor, a
    # process group made on it), as a CUDA device is once its context exists
    return _initialized or _session.initialized()


def _lazy_init() -> None:
    _current()


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def set_device(device) -> None:
    device_index(device)


class device:
    """``with torch.fornax.device(0):`` — a device context (index 0 is the only one)."""

    def __init__(self, device):
        self.idx = device_index(device)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def synchronize(device=None) -> None:
    device_index(device)
    _current().runtime.synchronize()


# -- RNG: the host generator (seeded ops run there, so results equal the CPU's) ------------------
def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
    torch.default_generator.seed()


seed_all = seed


def initial_seed() -> int:
    return torch.default_generator.initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    return torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device=None) -> None:
    torch.default_generator.set_state(new_state)


def get_rng_state_all() -> list:
    return [get_rng_state()]


def set_rng_state_all(states) -> None:
    set_rng_state(states[0])


# -- properties and versions --------------------------------------------------------------------
def get_device_properties(device=None):
    """The device's properties in the stack's framework vocabulary."""
    device_index(device)
    s = _current()
    fw = s.framework
    props = fw.device_properties(s.stack.driver, 0)
    return SimpleNamespace(**props)


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


def get_device_capability(device=None) -> tuple[int, int]:
    p = get_device_properties(device)
    return (getattr(p, "major", 0), getattr(p, "minor", 0))


class _Version:
    """``torch.fornax.version``: the version fields the stack's framework face sets
    (``cuda`` / ``hip`` / ``xpu``; None where the face does not set one)."""

    def __getattr__(self, name):
        versions = _current().framework.versions()
        if name in versions:
            return versions[name]
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"torch.fornax.version({_current().framework.versions()})"


version = _Version()


def face() -> dict:
    """How the active stack presents itself to PyTorch (device type, module, versions,
    distributed backend, autocast default)."""
    fw = _current().framework
    f = fw.face
    return {"vendor": fw.vendor, "device_type": f.device_type, "module": f.module,
            "dist_backend": f.dist_backend, **{f"version.{k}": v for k, v in fw.versions().items()},
            "autocast_dtype": str(fw.autocast_policy().default_dtype)}


def get_amp_supported_dtype() -> list:
    from .lowering import DTYPE_TO_TORCH
    from ...layers.graph import DType
    dtypes = _current().framework.autocast_policy().dtypes
    return [DTYPE_TO_TORCH[DType.of(d)] if not isinstance(d, torch.dtype) else d for d in dtypes]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return torch.bfloat16 in get_amp_supported_dtype()


# -- memory ---------------------------------------------------------------------------------------
def memory_stats(device=None) -> dict:
    device_index(device)
    return dict(_current().runtime.memory_stats())


def _stat(name: str) -> int:
    stats = memory_stats()
    if name not in stats:
        raise DeviceError(f"the runtime seam reports no {name!r} statistic", seam="runtime")
    return int(stats[name])


def memory_allocated(device=None) -> int:
    device_index(device)
    return _stat("allocated_bytes")


def max_memory_allocated(device=None) -> int:
    device_index(device)
    return _stat("peak_allocated_bytes")


def memory_reserved(device=None) -> int:
    device_index(device)
    return _stat("reserved_bytes")


def max_memory_reserved(device=None) -> int:
    device_index(device)
    return _stat("peak_reserved_bytes")


def memory_summary(device=None, abbreviated: bool = False) -> str:
    device_index(device)
    return _current().runtime.memory_summary()


def empty_cache() -> None:
    _current().runtime.empty_cache()


def reset_peak_memory_stats(device=None) -> None:
    device_index(device)
    alloc = _current().runtime.allocator()
    if hasattr(alloc, "reset_peak"):
        alloc.reset_peak()
    else:
        raise DeviceError("the runtime seam's allocator cannot reset its peaks", seam="runtime")


def mem_get_info(device=None) -> tuple[int, int]:
    device_index(device)
    s = _current()
    total = int(s.stack.driver.properties(0).memory_bytes)
    return total - memory_reserved(), total


# -- the stack --------------------------------------------------------------------------------------
def stack():
    """The composed stack the device runs on (see fornax.stack.Stack)."""
    return _current().stack


def report() -> dict:
    """Routes per ATen op (native, decomposed, fallback with reasons, views) on this stack."""
    return _current().report()

