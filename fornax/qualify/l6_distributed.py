"""L6, distributed: the stack composed with two devices; the library's all-reduce gives the
sum, and the framework face names a distributed backend PyTorch knows."""

from __future__ import annotations

import numpy as np

from ..contracts.clause import Outcome
from ..stack import compose
from .levels import evidence
from .subject import StackSubject, torch_fornax


@evidence("L6", "all_reduce", "the library's all-reduce across two devices gives the sum",
          seam="library", measured="elements differing from numpy's sum", relation="==", limit=0,
          dtype="float32", shape="[301] per rank, 2 ranks")
def _l6_all_reduce(s: StackSubject) -> Outcome:
    part = s.stack.layout
    if part is not None and len(s.stack.devices) >= 2 and part.mode.peer:
        stack = s.stack                   # partitions that reach each other: two of them are the ranks
        comm = stack.communicator([0, 1])
    else:                                 # no fabric between partitions (MIG): two whole chips
        stack = compose(s.derived(devices=2, partition="") if part is not None else s.derived(devices=2))
        comm = stack.communicator()
    rng = np.random.default_rng(s.config.seed + 60)
    count = 301                       # odd: the ring's chunks are uneven
    ints = [rng.integers(-1000, 1000, count).astype(np.float32) for _ in range(2)]
    reals = [rng.standard_normal(count).astype(np.float32) for _ in range(2)]
    # integer-valued floats sum exactly in any order; two float32 addends round the same
    # way in any order, so both are exact against numpy
    cases = {"integer-valued": (ints, ints[0] + ints[1]), "random": (reals, reals[0] + reals[1])}
    differ, parts = 0, []
    for name, (xs, want) in cases.items():
        send, recv = [], []
        for r in range(2):
            p = comm.malloc(r, count * 4)
            comm.upload(r, p, xs[r])
            send.append(p)
            recv.append(comm.malloc(r, count * 4))
        works = [comm.rank(r).all_reduce(send[r], recv[r], count, "float32", "sum") for r in range(2)]
        for w in works:
            w.wait()
        for r in range(2):
            got = comm.download(r, recv[r], count, "float32")
            n = int(np.sum(got.view(np.int32) != want.view(np.int32)))
            differ += n
            if n:
                parts.append(f"{name} data: rank {r} has {n} elements that are not the sum")
    detail = (f"{comm.name} over {comm.size} ranks ({stack.config.topology} fabric): every rank "
              "holds the exact sum, integer-valued and random data")
    return Outcome(differ, differ == 0, "; ".join(parts) or detail, build=s.build(stack))


@evidence("L6", "dist_backend", "the framework face names the distributed backend, one PyTorch "
          "knows, and torch.fornax reports the same", seam="framework",
          measured="torch.distributed backend name", relation="==",
          limit="a name in torch.distributed.Backend.backend_list")
def _l6_dist_backend(s: StackSubject) -> Outcome:
    import torch.distributed as dist
    s.torch()
    name = s.stack.framework.face.dist_backend
    shown = torch_fornax().face()["dist_backend"]
    known = list(dist.Backend.backend_list) if dist.is_available() else []
    problems = []
    if not name:
        problems.append("the face names no distributed backend")
    elif name not in known:
        problems.append(f"{name!r} is not a backend PyTorch knows ({', '.join(known)})")
    if shown != name:
        problems.append(f"torch.fornax.face() says {shown!r}, the framework seam {name!r}")
    return Outcome(name, not problems, "; ".join(problems) or
                   f"torch.distributed.init_process_group(backend={name!r}) on the "
                   f"{s.stack.framework.face.device_type!r} device type")
