"""Make ``torch.device("fornax")`` real, once per process.

PyTorch allows one PrivateUse1 backend per process and refuses a second fallback for
its key, so registration is guarded by a flag on the ``torch`` module itself (it
survives re-imports of this package and pytest's module juggling), and every
``torch.library.Library`` is kept in a process-global list: a collected Library takes
its kernels with it.

The route is PyTorch's pure-Python backend registration: the key is renamed
``fornax``, :mod:`.device` becomes ``torch.fornax``, storages are built around
simulated device addresses, and four places where PyTorch would call a C++ allocator
(or a PrivateUse1 hook) this backend does not have are patched to allocate through the
runtime seam instead: ``UntypedStorage.clone`` (``copy.deepcopy`` of a tensor),
``UntypedStorage.resize_`` (FSDP2 frees and refills unsharded parameters with it),
``torch.storage._to`` (``storage.to("fornax")``) and the ``fornax`` location tag of
``torch.load``.
"""

from __future__ import annotations

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from . import autocast as _autocast
from . import device as _device_module
from . import eager, fused, hazards, histogram, sparse
from . import module_apply as _module_apply
from . import profiler as _profiler
from . import tensors as T
from .device_index import device_index

_FLAG = "_fornax_backend_registered"
LIBRARIES: list = []
aten = torch.ops.aten

#: metadata-only ops: the CPU kernel on the same storage (they never touch bytes)
METADATA_OPS = ("view", "as_strided", "_reshape_alias", "set_.source_Storage",
                "set_.source_Storage_storage_offset", "_unsafe_view", "unfold", "view_as_real",
                "view_as_complex", "_has_same_storage_numel")


def registered() -> bool:
    return bool(getattr(torch, _FLAG, False))


def register() -> None:
    if registered():
        return
    _setup_privateuseone_for_python_backend("fornax", backend_module=_device_module)
    impl = torch.library.Library("aten", "IMPL")
    LIBRARIES.append(impl)
    for name in METADATA_OPS:
        op = _overload(name)
        impl.impl(name, _redispatch_cpu(op), "PrivateUse1")
    for name, fn in {**_KERNELS, **fused.KERNELS, **histogram.KERNELS}.items():
        kernel = _accounted(name, fn)
        impl.impl(name, kernel if name in _FACTORIES else _after_pending(kernel), "PrivateUse1")
    _register_lowered(impl)
    fallback = torch.library.Library("_", "IMPL")
    LIBRARIES.append(fallback)
    fallback.fallback(eager.dispatch, "PrivateUse1")
    sparse.register(LIBRARIES, _overload, _accounted)
    _autocast.register(LIBRARIES)
    _patch_storage()
    _profiler.install()
    _module_apply.install()
    setattr(torch, _FLAG, True)


def _register_lowered(impl) -> None:
    """Give every lowered op its own PrivateUse1 kernel (the router, as the fallback would
    run it): a functional op then reaches the device directly instead of through PyTorch's
    ``empty`` + ``out=`` wrapper.  Ops with a CompositeImplicitAutograd kernel are left to it
    (a backend kernel would shadow their autograd), as are those already registered here."""
    from .lowering import LOWERED_OPS
    # copies may cross devices: PyTorch's own copy_ sends them to _copy_from
    taken = set(METADATA_OPS) | set(_KERNELS) | set(fused.KERNELS) | set(histogram.KERNELS) | \
        {"copy_", "copy"}
    for key in sorted(LOWERED_OPS):
        name = key.removeprefix("aten::").removesuffix(".default")
        if name in taken:
            continue
        try:
            op = _overload(name)
            implicit = torch._C._dispatch_has_kernel_for_dispatch_key(op.name(),
                                                                       "CompositeImplicitAutograd")
        except (AttributeError, RuntimeError):   # a Python-only overload the dispatcher lacks
            continue
        if implicit:
            continue
        if eager.op_info(op).kind == "view":
            continue
        impl.impl(name, _routed(op), "PrivateUse1")


def _routed(op):
    def kernel(*args, **kwargs):
        return eager.dispatch(op, *args, **kwargs)
    return kernel


def _overload(name: str):
    base, _, ov = name.partition(".")
    return getattr(getattr(aten, base), ov or "default")


#: kernels that take no tensor, so no work can be pending on their inputs
_FACTORIES = frozenset({"empty.memory_format", "empty_strided"})
_COPIES = frozenset({"empty.memory_format", "empty_strided", "_copy_from", "_copy_from_and_resize",
                     "_to_copy", "_local_scalar_dense", "resize_"})


def _accounted(name: str, fn):
    """A registered kernel, counted in the session's routes like the fallback's ops: memory
    and copies as ``runtime`` (they are runtime-seam calls), the ATen-op compositions of
    :mod:`.fused` as ``decomposed``; the rest dispatch through the router, which counts."""
    if name in _COPIES:
        kind, reason = "runtime", "allocation or copy through the runtime seam"
    elif name in fused.KERNELS:
        kind, reason = "decomposed", "no CPU kernel exists; fornax composes it from ATen ops"
    elif name in sparse.KERNELS or name in sparse.DENSE_KERNELS:
        kind, reason = "decomposed", "sparse COO: composed from dense ops on its indices and values"
    else:
        return fn
    key = f"aten::{name}"

    def kernel(*args, **kwargs):
        out = fn(*args, **kwargs)
        eager.current().stats.record(key, kind, reason)
        return out
    return kernel


def _after_pending(fn):
    """``fn`` after the current stream waits for work still pending on its tensors
    (:mod:`.hazards`)."""
    def kernel(*args, **kwargs):
        hazards.before_use(eager.current(), args, kwargs)
        return fn(*args, **kwargs)
    return kernel


def _redispatch_cpu(op):
    """The CPU kernel of a metadata-only op on the same storage, counted as a ``view``."""
    key = op.name()

    def kernel(*args, **kwargs):
        out = op.redispatch(T._CPU_KEYS, *args, **kwargs)
        eager.current().stats.record(key, "view")
        return out
    return kernel


# -- kernels ----------------------------------------------------------------------------------------
def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    dtype = dtype or torch.get_default_dtype()
    _check_device(device)
    size = tuple(int(s) for s in size)
    stride = None
    if memory_format == torch.channels_last and len(size) == 4:
        stride = torch.empty(size, device="meta").contiguous(memory_format=memory_format).stride()
    elif memory_format == torch.channels_last_3d and len(size) == 5:
        stride = torch.empty(size, device="meta").contiguous(memory_format=memory_format).stride()
    return T.empty(size, dtype, stride)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device)
    return T.empty(size, dtype or torch.get_default_dtype(), stride)


def _check_device(device) -> None:
    if device is not None and getattr(device, "index", None):      # fornax:0 is the only one
        device_index(device)


def _copy_from(self, dst, non_blocking=False):
    eager.copy_into(dst, self)
    return dst


def _copy_from_and_resize(self, dst):
    if tuple(dst.shape) != tuple(self.shape):
        aten.resize_.default(dst, self.shape)
    return _copy_from(self, dst)


def _dense_strides(t):
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    return tuple(t.stride()) if is_non_overlapping_and_dense_or_false(t) else None


def _to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if isinstance(self, torch.nn.parameter.UninitializedTensorMixin):
        # a lazy module's placeholder refuses shape queries; moving it moves its empty data
        with torch._C.DisableTorchFunctionSubclass():
            self = torch.Tensor.as_subclass(self, torch.Tensor)
    dtype = dtype or self.dtype
    target = torch.device(device) if device is not None else self.device
    keep = memory_format in (None, torch.preserve_format)
    if target.type == "fornax":
        device_index(target)
        stride = _dense_strides(self) if keep else None
        out = T.empty(self.shape, dtype, stride)
        if memory_format not in (None, torch.preserve_format, torch.contiguous_format):
            out = out.contiguous(memory_format=memory_format) if out.numel() else out
        eager.copy_into(out, self)
        return out
    if target.type != "cpu":
        raise RuntimeError(f"fornax tensors move to the CPU or stay on fornax, not to {target}")
    out = T.read(self).to(dtype)             # read() keeps a dense tensor's strides
    if memory_format not in (None, torch.preserve_format):
        out = out.contiguous(memory_format=memory_format)
    if pin_memory:
        out = out.pin_memory() if torch.cuda.is_available() else out
    return out


def _local_scalar_dense(self):
    return T.read(self).item()


def _resize_(self, size, memory_format=None):
    size = tuple(int(s) for s in size)
    stride = T.contiguous_strides(size)
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        # ATen's empty_tensor_restride: channels_last (4-d) / channels_last_3d (5-d) strides,
        # and its own error for any other rank
        stride = torch.empty(0, device="meta").resize_(size, memory_format=memory_format).stride()
    need = (self.storage_offset() + T.span_elements(size, stride)) * self.element_size()
    storage = self.untyped_storage()
    if need > storage.nbytes():          # grown in place: every view of the storage sees it
        T.resize_storage(storage, need)
    aten.set_.source_Storage_storage_offset.redispatch(T._CPU_KEYS, self, storage,
                                                       self.storage_offset(), list(size), list(stride))
    return self


def _convolution_overrideable(input, weight, bias, stride, padding, dilation, transposed,
                              output_padding, groups):
    """PyTorch hands convolutions of out-of-tree backends to this hook; route it as the
    plain ``aten::convolution``."""
    return eager.dispatch(aten.convolution.default, input, weight, bias, stride, padding, dilation,
                          transposed, output_padding, groups)


def _convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation,
                                       transposed, output_padding, groups, output_mask):
    bias_sizes = [weight.shape[1] * groups if transposed else weight.shape[0]]
    return eager.dispatch(aten.convolution_backward.default, grad_output, input, weight, bias_sizes,
                          stride, padding, dilation, transposed, output_padding, groups, output_mask)


def _native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """Training batch norm updates ``running_mean``/``running_var`` in place although its
    schema does not say so: run the functional form and write the new statistics back."""
    if training and running_mean is not None and running_var is not None:
        out, mean, rstd, new_mean, new_var = eager.dispatch(
            aten._native_batch_norm_legit_functional.default, input, weight, bias, running_mean,
            running_var, training, momentum, eps)
        eager.copy_into(running_mean, new_mean)
        eager.copy_into(running_var, new_var)
        return out, mean, rstd
    return eager.dispatch(aten._native_batch_norm_legit_no_training.default, input, weight, bias,
                          running_mean, running_var, momentum, eps) if running_mean is not None \
        else eager.dispatch(aten._native_batch_norm_legit.no_stats, input, weight, bias, training,
                            momentum, eps)


_KERNELS = {
    "native_batch_norm": _native_batch_norm,
    "convolution_overrideable": _convolution_overrideable,
    "convolution_backward_overrideable": _convolution_backward_overrideable,
    "empty.memory_format": _empty,
    "empty_strided": _empty_strided,
    "_copy_from": _copy_from,
    "_copy_from_and_resize": _copy_from_and_resize,
    "_to_copy": _to_copy,
    "_local_scalar_dense": _local_scalar_dense,
    "resize_": _resize_,
    # ATen's composite mode.values admits only CPU, CUDA and XPU tensors: route it here instead
    # (an out= op: it runs mode and writes values and indices back)
    "mode.values": lambda *args, **kwargs: eager.dispatch(aten.mode.values, *args, **kwargs),
    # ATen's conj_physical_ calls the CPU/CUDA kernel stub directly: route it as an in-place op
    "conj_physical_": lambda self: eager.dispatch(aten.conj_physical_.default, self),
}


# -- storages: the places PyTorch would call a C++ allocator --------------------------------------
def _clone_storage(storage) -> torch.UntypedStorage:
    """A fornax copy of a fornax storage, through the runtime seam (device to device)."""
    new = T.new_storage(storage.nbytes())
    _copy_storage(new, storage)
    return new


def _copy_storage(dst, src) -> None:
    """``src``'s bytes into the start of ``dst`` (both fornax storages), device to device on
    the current stream."""
    if src.nbytes():
        session = eager.current()
        session.runtime.memcpy_d2d(session.address(dst.data_ptr()), session.address(src.data_ptr()),
                                   src.nbytes(), eager.current_runtime_stream(session))


def _storage_to_fornax(storage) -> torch.UntypedStorage:
    """A CPU storage's bytes in a new fornax storage."""
    if storage.device.type == "fornax":
        return storage
    data = torch.empty(0, dtype=torch.uint8).set_(storage.untyped()
                                                  if hasattr(storage, "untyped") else storage)
    t = T.to_device(data)
    return t.untyped_storage()


def _patch_storage() -> None:
    base = torch.storage._StorageBase
    original_clone = base.clone
    original_to = torch.storage._to

    def clone(self):
        if self.device.type == "fornax":
            return _clone_storage(self)
        return original_clone(self)

    def to(self, device, non_blocking=False):
        device = torch.device(device)
        if self.device.type == "fornax" and device.type == "fornax":
            return self
        if device.type == "fornax":
            return _storage_to_fornax(self)
        if self.device.type == "fornax":
            host = T.read(T.wrap(self, (self.nbytes(),), (1,), torch.uint8))
            return host.untyped_storage()
        return original_to(self, device, non_blocking)

    def fornax(self, device=None, non_blocking=False):
        return to(self, "fornax", non_blocking)

    original_resize = torch.UntypedStorage.resize_

    def resize_(self, size):
        if self.device.type == "fornax":
            T.resize_storage(self, size)
            return self
        return original_resize(self, size)

    # torch's storage classes, patched in place (their stubs declare no such assignments)
    setattr(base, "clone", clone)
    setattr(torch.UntypedStorage, "clone", clone)
    torch.storage._to = to
    setattr(base, "fornax", fornax)
    setattr(torch.UntypedStorage, "fornax", fornax)
    setattr(torch.UntypedStorage, "resize_", resize_)

    def tag(obj):
        if getattr(obj, "device", None) is not None and obj.device.type == "fornax":
            return "fornax"
        return None

    def restore(obj, location):
        if location.startswith("fornax"):
            device_index(location)
            return _storage_to_fornax(obj)
        return None
    torch.serialization.register_package(9, tag, restore)
