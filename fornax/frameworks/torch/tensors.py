"""Tensors whose bytes live in simulated device memory.

A fornax tensor is an ordinary ``torch.Tensor`` on the PrivateUse1 key (renamed
``fornax``) whose storage was built with ``torch._C._construct_storage_from_data_pointer``:
its data pointer is the tagged simulated device address (see :mod:`.session`), so
``t.data_ptr()`` is exactly ``storage address + storage_offset * itemsize``, the number a
kernel receives.  The storage is freed through the runtime seam's caching allocator
when PyTorch drops its last reference (a weak reference's callback on the storage, which
may run on any thread, e.g. the autograd engine's).

Moving data between the host and the device always goes through the runtime seam
(``memcpy_h2d`` / ``memcpy_d2h`` on the session's current stream).  Strided tensors are
read and written as the byte span they cover, so views, storage offsets and
in-place writes through a view keep PyTorch's exact semantics.
"""

from __future__ import annotations

import atexit
import weakref
from typing import cast

import numpy as np
import torch

from . import hazards
from .session import DeviceError, Session, current

DEVICE = "fornax"
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

#: torch dtypes the device stores (anything with a numpy twin of the same bytes)
_NUMPY = {torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16,
          torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
          torch.uint8: np.uint8, torch.bool: np.bool_, torch.complex64: np.complex64,
          torch.complex128: np.complex128}
# bfloat16 has no numpy twin: its bytes travel as int16 and are reinterpreted by torch
_VIEW_AS = {torch.bfloat16: (np.int16, torch.int16)}


def is_fornax(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == DEVICE


def numpy_dtype(dtype: torch.dtype):
    if dtype in _NUMPY:
        return _NUMPY[dtype]
    if dtype in _VIEW_AS:
        return _VIEW_AS[dtype][0]
    raise DeviceError(f"dtype {dtype} cannot be stored on the fornax device", seam="framework",
                      hint="convert to a float, integer or bool dtype first")


def _storage_at(ptr: int, nbytes: int) -> torch.UntypedStorage:
    # typed as either storage kind by torch's stubs; it makes an untyped one (that owns nothing)
    return cast(torch.UntypedStorage,
                torch._C._construct_storage_from_data_pointer(ptr, torch.device(DEVICE, 0), int(nbytes)))


def new_storage(nbytes: int, session: Session | None = None, stream=None) -> torch.UntypedStorage:
    """A storage of ``nbytes`` in simulated device memory (freed when torch drops it);
    ``stream``: the runtime stream whose pool it comes from (default: this thread's)."""
    session = session or current()
    ptr = session.malloc(nbytes, stream)
    storage = _storage_at(ptr, nbytes)
    # what the storage owns is a one-element list, so that resize_storage can change it
    owned = [ptr]
    setattr(storage, _OWNED, owned)
    _LIVE[weakref.ref(storage, _collected)] = (session, owned)
    return storage


_OWNED = "_fornax_owned"
#: the weak reference of every live fornax storage -> (session, [address]); its callback frees
#: the address when torch drops the storage (a plain weak reference: ``weakref.finalize``
#: costs several times more on the hot path of every eager op's output)
_LIVE: dict = {}
_exiting = False


def _collected(ref) -> None:
    entry = _LIVE.pop(ref, None)
    if entry is not None and not _exiting:
        _free(*entry)


@atexit.register
def _at_exit() -> None:
    # at interpreter exit the bytes go with the process: freeing them there would wait on the
    # simulated device (a blocking free synchronises), so nothing is freed from then on
    global _exiting
    _exiting = True


def _free(session: Session, owned: list) -> None:
    ptr, owned[:] = owned[0], [None]
    if ptr is None:
        return
    try:
        session.free(ptr)
    except Exception:           # at interpreter exit the runtime may already be gone
        pass


def resize_storage(storage: torch.UntypedStorage, nbytes: int, session: Session | None = None) -> None:
    """Resize a fornax storage in place, as ``UntypedStorage.resize_`` does on a GPU: every
    tensor viewing it sees the new bytes.  The first ``min(old, new)`` bytes are kept (copied
    device to device); the old allocation goes back to the caching allocator, stream-ordered.
    ``resize_(0)`` frees the memory and keeps the storage, which FSDP2 relies on to drop
    unsharded parameters between uses."""
    session = session or current()
    nbytes = int(nbytes)
    if nbytes < 0:
        raise DeviceError(f"a storage cannot be resized to {nbytes} bytes", seam="framework",
                          vendor=session.framework.vendor, hint="give a size of 0 or more bytes")
    old = storage.nbytes()
    if nbytes == old:
        return
    owned = getattr(storage, _OWNED, None)
    if owned is None:
        raise DeviceError("this fornax storage does not own its memory (it was built around "
                          "another allocation), so it cannot be resized", seam="framework",
                          vendor=session.framework.vendor,
                          hint="resize a storage made by fornax (a tensor's own storage)")
    new_ptr = session.malloc(nbytes) if nbytes else None
    if new_ptr is not None and old and owned[0] is not None:
        session.runtime.memcpy_d2d(session.address(new_ptr), session.address(storage.data_ptr()),
                                   min(old, nbytes), _stream(session))
    # swapping data pointers needs one side empty: empty the storage, then fill it (a method
    # of torch's C storage base that its stubs do not declare)
    swap = getattr(storage, "_swap_data_ptr_")
    swap(_storage_at(0, 0))
    if new_ptr is not None:
        swap(_storage_at(new_ptr, nbytes))
    old_ptr, owned[:] = owned[0], [new_ptr]
    if old_ptr is not None:
        session.free(old_ptr)


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(tuple(shape)):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


def span_elements(shape, stride) -> int:
    """Elements from the first to one past the last one a view of ``shape``/``stride`` reaches."""
    n = 1
    for d, s in zip(shape, stride):
        if d == 0:
            return 0
        n += (d - 1) * s
    return n


_SET = torch.ops.aten.set_.source_Storage_storage_offset._handle


def wrap(storage, shape, stride, dtype: torch.dtype, offset: int = 0) -> torch.Tensor:
    """A fornax tensor viewing ``storage`` (no copy)."""
    t = torch._C._acc.create_empty_tensor((0,), dtype)
    # the CPU kernel of set_ only re-points metadata; called straight on the operator handle
    _SET.redispatch_boxed(_CPU_KEYS, t, storage, int(offset), list(shape), list(stride))
    return t


def empty(shape, dtype: torch.dtype, stride=None, session: Session | None = None, stream=None) -> torch.Tensor:
    shape = tuple(int(d) for d in shape)
    stride = contiguous_strides(shape) if stride is None else tuple(int(s) for s in stride)
    nbytes = span_elements(shape, stride) * dtype.itemsize
    return wrap(new_storage(nbytes, session, stream), shape, stride, dtype)


def empty_contiguous(shape: tuple, stride: tuple, nbytes: int, dtype: torch.dtype, session: Session,
                     stream) -> torch.Tensor:
    """:func:`empty` for a caller that already knows the contiguous strides and byte size
    (the eager dispatch cache: no argument normalisation on its hot path)."""
    return wrap(new_storage(nbytes, session, stream), shape, stride, dtype)


def address(t: torch.Tensor, session: Session | None = None) -> int:
    """The simulated device address of ``t``'s first element."""
    session = session or current()
    return session.address(t.data_ptr(), "tensor")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """(first element's address, bytes covered) of a fornax tensor view."""
    n = span_elements(t.shape, t.stride())
    return address(t), n * t.element_size()


def read(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of a fornax tensor (its logical elements, contiguous)."""
    session = current()
    if t.numel() == 0:
        return torch.empty(t.shape, dtype=t.dtype)
    hazards.before_use(session, t)
    addr, nbytes = _span(t)
    raw = np.empty(nbytes, dtype=np.uint8)
    with session.lock:
        session.runtime.memcpy_d2h(raw, addr, _stream(session), blocking=True)
    flat = torch.from_numpy(raw).view(t.dtype)
    return _flags_applied(flat.as_strided(tuple(t.shape), tuple(t.stride())).clone(), t)


def _flags_applied(host: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``host`` negated / conjugated where ``t`` carries PyTorch's lazy neg / conj flag: the
    flag's logical values from ``t``'s bytes, or (both are their own inverse) the bytes
    that show ``host``'s values through ``t``."""
    if t.is_neg():
        host = host.neg()
    if t.is_conj():
        host = host.conj_physical()
    return host


def write(t: torch.Tensor, src: torch.Tensor) -> None:
    """Copy the CPU tensor ``src`` (broadcast to ``t``'s shape, cast to its dtype) into the
    fornax tensor ``t``, honouring ``t``'s strides and offset.  A ZeroTensor (autograd's
    storage-less zeros, e.g. from a CPU fallback of ``_efficientzerotensor``) is written as
    real zeros."""
    session = current()
    if t.numel() == 0:
        return
    hazards.before_use(session, t)
    src = _flags_applied(_host_values(src, t.dtype), t).expand(t.shape)
    addr, nbytes = _span(t)
    stream = _stream(session)
    with session.lock:
        if t.is_contiguous():
            data = src.contiguous().view(-1)
        else:                    # read-modify-write the span: elements between the view's are kept
            raw = np.empty(nbytes, dtype=np.uint8)
            session.runtime.memcpy_d2h(raw, addr, stream, blocking=True)
            data = torch.from_numpy(raw).view(t.dtype)
            data.as_strided(tuple(t.shape), tuple(t.stride())).copy_(src)
        host = _as_numpy(data)
        # ``held``: nothing touches ``host`` before the wait below, so the copy reads it in
        # place (no staging copy); the host buffer may go away after we return
        session.runtime.memcpy_h2d(addr, host.view(np.uint8), stream, held=True)
        session.runtime.stream_synchronize(stream)


def _host_values(src: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``src``'s values as a plain CPU tensor of ``dtype``: a ZeroTensor as real zeros, the
    conjugate and negative bits resolved."""
    if src._is_zerotensor():
        src = torch.zeros(src.shape, dtype=src.dtype)
    return src.resolve_conj().resolve_neg().to(dtype=dtype)


def staged(host: np.ndarray, shape: tuple, dtype: torch.dtype, session: Session, stream) -> torch.Tensor:
    """A new contiguous fornax tensor of ``shape``/``dtype`` holding the bytes of ``host`` (C
    order), copied in ``stream``'s order without a wait: the runtime stages the bytes when the
    copy is submitted, so ``host`` may change afterwards."""
    t = empty(shape, dtype, session=session)
    session.runtime.memcpy_h2d(address(t, session), np.ascontiguousarray(host).reshape(-1).view(np.uint8),
                               stream)
    return t


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype in _VIEW_AS:
        t = t.view(_VIEW_AS[t.dtype][1])
    return np.ascontiguousarray(t.numpy())


#: bytes up to which :func:`to_device` stages a copy and returns without waiting, as a
#: synchronous copy from pageable memory does for small sizes (larger ones are read in place
#: and waited for, so the host never holds a second copy of a big tensor)
STAGED_BYTES = 64 * 1024


def to_device(src: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new contiguous fornax tensor holding a CPU tensor's values."""
    dtype = dtype or src.dtype
    nbytes = src.numel() * dtype.itemsize
    if 0 < nbytes <= STAGED_BYTES:
        session = current()
        data = _host_values(src, dtype).contiguous()
        with session.lock:
            return staged(_as_numpy(data.view(-1)), tuple(src.shape), dtype, session, _stream(session))
    out = empty(src.shape, dtype)
    write(out, src)
    return out


def _stream(session: Session):
    from .streams import current_runtime_stream     # the stream torch.fornax.stream(...) selected
    return current_runtime_stream(session)
