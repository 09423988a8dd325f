"""One DDP training step measured on each rank (run by :mod:`benchmarks.ddp_scaling` under
torchrun): host wall and simulated time per step, and how the simulated step splits into
compute and communication on the rank's device."""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

import fornax.frameworks.torch as ft
from fornax.frameworks.torch import distributed as fd

WARMUP, STEPS, BATCH = 2, 5, 64


def _busy(records, kind: str, lo: float) -> float:
    """Simulated seconds records of ``kind`` after ``lo`` cover (overlaps counted once)."""
    spans = sorted((r.start, r.end) for r in records if r.kind == kind and r.start >= lo)
    total, end = 0.0, lo
    for a, b in spans:
        a = max(a, end)
        if b > a:
            total += b - a
            end = b
    return total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--family", default="cuda-like")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    ft.use_stack(args.family)                       # the default chip spec (h200-like)
    dist.init_process_group("fornax", timeout=timedelta(seconds=120))
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)).to("fornax")
    net = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(BATCH, 512, generator=g).to("fornax"), torch.randn(BATCH, 512, generator=g).to("fornax")
    fornax = getattr(torch, "fornax")
    timeline = ft.stack().devices[0].timeline

    def step() -> None:
        opt.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    fornax.synchronize()
    dist.barrier()
    fornax.synchronize()
    sim0, wall0 = timeline.host_time, time.perf_counter()
    for _ in range(STEPS):
        step()
    fornax.synchronize()
    wall, sim = time.perf_counter() - wall0, timeline.host_time - sim0
    rep = fd.report() or {"collectives": []}
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    out = {"rank": rank, "world_size": size, "family": args.family,
           "host_wall_per_step_s": wall / STEPS, "simulated_per_step_s": sim / STEPS,
           "compute_per_step_s": _busy(timeline.records, "kernel", sim0) / STEPS,
           "communication_per_step_s": _busy(timeline.records, "collective", sim0) / STEPS,
           "gradient_bytes": grads, "topology": rep.get("topology")}
    if rank == 0:
        args.out.write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
