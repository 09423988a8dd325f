"""L1, allocation, copies, views: tensors go to the device and back bit-exactly; views,
strides and in-place writes through views keep PyTorch semantics; memory statistics follow
allocations."""

from __future__ import annotations


from ..contracts.clause import Outcome
from .levels import evidence
from .subject import StackSubject, torch_fornax


_ROUNDTRIP = ("float32", "float16", "bfloat16", "int64", "bool")


@evidence("L1", "roundtrip", "host -> device -> host round trip is bit-exact (NaN, inf, -0.0, "
          "subnormals included)", seam="runtime", measured="elements whose bits differ",
          relation="==", limit=0, dtype=", ".join(_ROUNDTRIP), shape="[3, 5, 7]")
def _l1_roundtrip(s: StackSubject) -> Outcome:
    import torch
    s.torch()
    g = torch.Generator().manual_seed(s.config.seed)
    bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
    differ, per = 0, []
    for name in _ROUNDTRIP:
        dtype = getattr(torch, name)
        if dtype.is_floating_point:
            x = (torch.randn(3, 5, 7, generator=g) * 100).to(dtype)
            flat = x.view(-1)
            flat[:5] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0,
                                     torch.finfo(dtype).tiny / 4], dtype=dtype)
        elif dtype == torch.bool:
            x = torch.rand(3, 5, 7, generator=g) > 0.5
        else:
            x = torch.randint(-2**62, 2**62, (3, 5, 7), generator=g, dtype=dtype)
        back = x.to("fornax").cpu()
        if back.dtype != dtype or back.shape != x.shape:
            differ += x.numel()
            per.append(f"{name}: came back as {back.dtype}{list(back.shape)}")
            continue
        if dtype in bits:
            n = int((back.view(bits[dtype]) != x.view(bits[dtype])).sum())
        else:
            n = int((back != x).sum())
        differ += n
        if n:
            per.append(f"{name}: {n} elements differ")
    return Outcome(differ, differ == 0, "; ".join(per) or f"{len(_ROUNDTRIP)} dtypes bit-exact")


_VIEWS = {
    "t[1:4, ::2]": lambda t: t[1:4, ::2],
    "t.t()": lambda t: t.t(),
    "t[2]": lambda t: t[2],
    "t[:, 3:5].T": lambda t: t[:, 3:5].T,
    "t.view(4, 12)[1:]": lambda t: t.view(4, 12)[1:],
    "t.unsqueeze(0).expand(3, 6, 8)": lambda t: t.unsqueeze(0).expand(3, 6, 8),
    "t.as_strided((3, 3), (9, 2), 5)": lambda t: t.as_strided((3, 3), (9, 2), 5),
    "t.reshape(2, 24)[:, 1::5]": lambda t: t.reshape(2, 24)[:, 1::5],
}


def _mutate(t):
    """In-place writes through views of ``t`` (exact in float32, so CPU and device agree
    bit for bit)."""
    t[1:4, ::2].mul_(2)
    t.t()[3].add_(1)
    t[:, 5].zero_()
    t.view(4, 12)[2, 3:9].copy_(t[0, :6].clone())
    return t


@evidence("L1", "views", "views, strides and storage offsets match CPU; in-place writes through "
          "views reach the base", seam="framework", measured="mismatches against CPU",
          relation="==", limit=0, dtype="float32", shape="[6, 8] and 8 views of it")
def _l1_views(s: StackSubject) -> Outcome:
    import torch
    session = s.torch()
    g = torch.Generator().manual_seed(s.config.seed + 1)
    x = torch.randn(6, 8, generator=g)
    d = x.to("fornax")
    bad = []
    base_ptr = session.address(d.data_ptr())
    for name, fn in _VIEWS.items():
        cv, dv = fn(x), fn(d)
        if (dv.shape, dv.stride(), dv.storage_offset()) != (cv.shape, cv.stride(), cv.storage_offset()):
            bad.append(f"{name}: size/stride/offset {list(dv.shape)}/{dv.stride()}/"
                       f"{dv.storage_offset()} vs CPU {list(cv.shape)}/{cv.stride()}/{cv.storage_offset()}")
        elif session.address(dv.data_ptr()) != base_ptr + 4 * dv.storage_offset():
            bad.append(f"{name}: does not alias the base's storage")
        elif not torch.equal(dv.cpu(), cv):
            bad.append(f"{name}: values differ")
    if not torch.equal(_mutate(d).cpu(), _mutate(x.clone())):
        bad.append("in-place writes through views: the base differs from CPU")
    return Outcome(len(bad), not bad, "; ".join(bad) or
                   f"{len(_VIEWS)} views alias the base with CPU's sizes, strides and offsets; "
                   "4 in-place writes through views agree bit for bit")


@evidence("L1", "memory", "memory statistics move with an allocation and come back after it is "
          "freed", seam="runtime", measured="bytes memory_allocated() grew by", relation=">=",
          limit=4 << 20, dtype="float32", shape="[1048576]")
def _l1_memory(s: StackSubject) -> Outcome:
    import torch
    s.torch()
    nbytes = 4 << 20
    before = torch_fornax().memory_allocated()
    t = torch.empty(nbytes // 4, device="fornax")
    during = torch_fornax().memory_allocated()
    peak = torch_fornax().max_memory_allocated()
    reserved = torch_fornax().memory_reserved()
    del t
    after = torch_fornax().memory_allocated()
    problems = []
    if during - before < nbytes:
        problems.append(f"memory_allocated grew by {during - before} bytes for a {nbytes}-byte tensor")
    if peak < during:
        problems.append(f"max_memory_allocated {peak} is below memory_allocated {during}")
    if reserved < during:
        problems.append(f"memory_reserved {reserved} is below memory_allocated {during}")
    if after != before:
        problems.append(f"after del, memory_allocated is {after}, was {before} before")
    return Outcome(during - before, not problems, "; ".join(problems) or
                   f"allocated {before} -> {during} -> {after} bytes; peak {peak}, reserved {reserved}")
