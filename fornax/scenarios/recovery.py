"""Checkpointing and recovery on fornax under torchrun: FSDP2 training that survives a lost
device or a failed link on one rank.

    python -m torch.distributed.run --nproc-per-node 2 --max-restarts 1 \\
        -m fornax.scenarios.recovery --checkpoint DIR --out DIR --fail device_lost

Each rank trains the scenario MLP, fully sharded with FSDP2 over a ``fornax`` group, on its
shard of a deterministic global batch (one per step), with SGD and momentum.  Every
``--checkpoint-every`` steps the sharded model and optimizer state are saved with
``torch.distributed.checkpoint`` (each rank writes its own shards).  On start, the job
resumes from the newest complete checkpoint.

``--fail KIND`` injects a fault on ``--fail-rank`` at step ``--fail-at`` in the first attempt
only (torchrun's ``TORCHELASTIC_RESTART_COUNT`` is 0):

* ``device_lost``: that rank's device is lost at its next kernel.  Its host sees the
  family's error at the next synchronisation, aborts its communicators and exits; the
  other ranks' pending collective fails with the family's remote error.
* ``link_failure``: the link under that rank's next collective fails.  The rank announces
  it in the exchange, so every rank fails that same collective with the family's error.

Either way every rank records its error in ``--out`` (``attempt<A>/rank<R>.json``) and exits
non-zero; torchrun (``--max-restarts 1``) starts the job again, which resumes from the last
checkpoint and finishes; ``final/rank<R>.json`` holds the per-step losses and the final
weights' checksum, equal to an uninterrupted run's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

import fornax.frameworks.torch as ft
from fornax.frameworks.torch import distributed as fd
from fornax.scenarios.distributed import mlp
from fornax.sim.faults import FaultPlan, FaultSpec

KINDS = ("device_lost", "link_failure")


def batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch (8 rows per rank), the same in every attempt."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(8 * size, 8, generator=g), torch.randn(8 * size, 4, generator=g)


def cpu_losses(steps: int, size: int) -> list[float]:
    """The losses of single-process CPU training on the global batches (no sharding)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    out = []
    for step in range(steps):
        x, y = batch(step, size)
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def newest_checkpoint(folder: Path) -> tuple[int, Path] | None:
    """(step, path) of the newest complete checkpoint (DCP writes ``.metadata`` last)."""
    done = [(int(p.name.removeprefix("step-")), p) for p in folder.glob("step-*")
            if (p / ".metadata").exists() and p.name.removeprefix("step-").isdigit()]
    return max(done) if done else None


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def train(args: argparse.Namespace, rank: int, size: int, attempt: int) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # as a CUDA program writes it: DeviceMesh over the world, on the device torchrun's LOCAL_RANK
    # would name (each process has one, already initialised by the process group)
    mesh = init_device_mesh("fornax", (size,), mesh_dim_names=("dp",))
    model = mlp().to("fornax")
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start, resumed = 0, None
    found = newest_checkpoint(args.checkpoint)
    if found is not None:
        start, path = found
        state = _state(model, opt)
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        resumed = start
    losses: dict[int, float] = {}
    for step in range(start, args.steps):
        if args.fail and attempt == 0 and rank == args.fail_rank and step == args.fail_at:
            device = ft.stack().devices[0]
            op = "kernel" if args.fail == "device_lost" else "peer"     # a link: the next collective
            device.inject(FaultPlan((FaultSpec(args.fail, at=1, op=op),)))
            print(f"rank {rank}: injecting {args.fail} at step {step} (next {op})", file=sys.stderr, flush=True)
        x, y = batch(step, size)
        xs, ys = x[8 * rank:8 * rank + 8].to("fornax"), y[8 * rank:8 * rank + 8].to("fornax")
        opt.zero_grad()
        loss = ((model(xs) - ys) ** 2).mean()
        loss.backward()
        opt.step()
        # each rank's loss is on its shard; the global loss is their mean
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses[step] = total.item()
        if (step + 1) % args.checkpoint_every == 0:
            dcp.save(_state(model, opt), checkpoint_id=str(args.checkpoint / f"step-{step + 1}"))
    params: list[Any] = list(model.parameters())
    full = [p.full_tensor().detach().cpu() for p in params]
    return {"losses": losses, "resumed_from": resumed, "attempt": attempt,
            "checksum": float(sum(t.double().sum().item() for t in full)),
            "weights": [t.flatten().tolist() for t in full], "backend": fd.report()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fornax.scenarios.recovery")
    p.add_argument("--family", default="cuda-like")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--checkpoint-every", type=int, default=2)
    p.add_argument("--checkpoint", type=Path, required=True, help="folder for the DCP checkpoints")
    p.add_argument("--out", type=Path, required=True, help="folder for each attempt's records")
    p.add_argument("--fail", choices=KINDS, default=None, help="inject this fault in the first attempt")
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-at", type=int, default=3, help="the step the fault is injected at")
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    if args.steps < 1 or args.checkpoint_every < 1:
        p.error("--steps and --checkpoint-every must be at least 1")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    ft.use_stack(args.family, spec="tiny")
    dist.init_process_group("fornax", timeout=timedelta(seconds=args.timeout))
    rank, size = dist.get_rank(), dist.get_world_size()
    if args.fail and not 0 <= args.fail_rank < size:
        p.error(f"--fail-rank {args.fail_rank} is not a rank of this world of {size}")
    try:
        result = train(args, rank, size, attempt)
    except Exception as exc:       # the family's error: record it, let the others fail, exit
        record = {"attempt": attempt, "rank": rank, "type": type(exc).__name__, "error": str(exc)}
        folder = args.out / f"attempt{attempt}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank{rank}.json").write_text(json.dumps(record, indent=1))
        print(f"rank {rank}, attempt {attempt}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        group = fd.process_group()
        if group is not None:
            group.abort()
        # torchrun stops every rank once one exits: wait (bounded) until each rank has recorded
        # its error, so a slow peer is not stopped before it writes its record
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and len(list(folder.glob("rank*.json"))) < size:
            time.sleep(0.05)
        os._exit(1)               # torchrun restarts the job (the group is aborted: no shutdown)
    folder = args.out / "final"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{rank}.json").write_text(json.dumps(result, indent=1, default=str))
    if rank == 0:
        steps = ", ".join(f"{s}: {v:.6f}" for s, v in sorted(result["losses"].items()))
        print(f"{args.family}: attempt {attempt}, resumed from step {result['resumed_from']}; "
              f"losses {steps}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
