"""The host fallback of the eager kernels: an op runs on CPU copies of its device inputs.

Results come back to the device, mutated inputs are written back in place, and the
call is counted with its reason (:meth:`.session.OpStats.record`).  A device tensor
passed at several positions is one host tensor, so aliasing is kept.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

from . import tensors as T
from .session import Session

aten = torch.ops.aten


def run_on_host(session: Session, info, op, args, kwargs, reason: str, home: bool = True):
    """Run ``op`` on host copies of its inputs; new results come back to the device unless
    ``home`` is False (the call asked for another device), mutated inputs always do."""
    originals: dict[int, torch.Tensor] = {}
    copies: dict[int, torch.Tensor] = {}       # a tensor passed twice is one host tensor too

    def to_cpu(x):
        if T.is_fornax(x):
            c = copies.get(id(x))
            if c is None:
                c = copies[id(x)] = T.read(x)
                originals[id(c)] = x
            return c
        if isinstance(x, torch.device) and x.type == T.DEVICE:
            return torch.device("cpu")
        return x
    cargs, ckwargs = tree_map(to_cpu, (args, kwargs))
    res = op(*cargs, **ckwargs)
    for pos, name in info.mutated:
        c = ckwargs[name] if name in ckwargs else (cargs[pos] if pos < len(cargs) else None)
        for cc in (c if isinstance(c, (list, tuple)) else [c]):
            if not isinstance(cc, torch.Tensor):
                continue
            orig = originals.get(id(cc))
            if orig is None:
                continue
            if tuple(orig.shape) != tuple(cc.shape):
                aten.resize_.default(orig, cc.shape)
            T.write(orig, cc)

    def back(x):
        if isinstance(x, torch.Tensor):
            orig = originals.get(id(x))
            if orig is not None:
                return orig
            if x.device.type == "cpu" and home:
                if x.layout != torch.strided:
                    raise NotImplementedError(
                        f"{info.name} on fornax: its result has layout {x.layout}, and the fornax device "
                        f"has strided and sparse COO kernels only; keep such tensors on the CPU (or "
                        f"call .to_dense() before moving them)")
                return T.to_device(x)
        return x
    out = tree_map(back, res)
    session.stats.record(info.name, "fallback", reason)
    return out
