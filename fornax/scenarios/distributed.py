"""A torch.distributed program on fornax, as torchrun runs it: one process per rank, each on
its own simulated device, for every family in turn.

    python -m torch.distributed.run --nproc-per-node 2 -m fornax.scenarios.distributed --out DIR

For each family it switches the ``fornax`` device to that family's stack, makes a ``fornax``
group over the world and checks, against values computed on the CPU:

* every collective: all_reduce (SUM, AVG, MAX, MIN, PRODUCT), broadcast, reduce, all_gather,
  all_gather_single (all_gather_into_tensor), reduce_scatter_single (reduce_scatter_tensor), all_to_all_single with uneven splits,
  scatter, gather, send/recv around a ring, barrier;
* that the ranks' simulated clocks meet at each collective (every rank's all_reduce ends at
  the same simulated time);
* that an async all_reduce overlaps a matmul issued before its ``wait()``;
* DDP: three SGD steps of a small MLP on each rank's shard of a batch give the weights
  single-process CPU training on the whole batch gives;
* FSDP2: the same with ``fully_shard`` (each rank holding its shard of the parameters), in
  float32 and with bfloat16 mixed precision;
* DTensor tensor parallelism on a DeviceMesh (ColwiseParallel / RowwiseParallel; a 2-D
  data x tensor mesh on four or more ranks): forward and gradients as on the CPU;
* pipeline parallelism (torch.distributed.pipelining, one stage per rank, GPipe and 1F1B):
  losses and gradients as on the CPU.

Each rank writes ``rank<R>.json`` to ``--out`` (what it checked, the collectives its backend
recorded); rank 0 prints one line per family.  ``--only`` runs some of the checks
(collectives, clocks, overlap, ddp, fsdp, tp, pp); ``--trace DIR`` writes each rank's Perfetto
trace per family; ``--skip-on RANK`` makes that rank skip one more
all_reduce, to show the others fail with the family's error instead of hanging.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

import fornax.frameworks.torch as ft
from fornax.frameworks.torch import distributed as fd
from fornax.frameworks.torch.distributed.rank_trace import write_rank_trace
from fornax.stack import BUILTIN_FAMILIES

REDUCTIONS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
              "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}


def _value(rank: int, n: int = 6) -> torch.Tensor:
    """Rank ``rank``'s input: distinct per rank, exact in float32."""
    return torch.arange(n, dtype=torch.float32) * (rank + 1) + rank


def collectives(group: Any, rank: int, size: int) -> dict[str, bool]:
    """Every collective on ``group`` against its CPU result; True where it matches exactly."""
    dev = "fornax"
    xs = [_value(r) for r in range(size)]
    ok: dict[str, bool] = {}
    for name, op in REDUCTIONS.items():
        x = xs[rank].to(dev)
        dist.all_reduce(x, op=op, group=group)
        stacked = torch.stack(xs)
        want = {"sum": stacked.sum(0), "avg": stacked.sum(0) / size, "max": stacked.max(0).values,
                "min": stacked.min(0).values, "product": stacked.prod(0)}[name]
        ok[f"all_reduce {name}"] = torch.allclose(x.cpu(), want, rtol=1e-6, atol=0)
    y = xs[rank].to(dev)
    dist.broadcast(y, src=size - 1, group=group)
    ok["broadcast"] = torch.equal(y.cpu(), xs[size - 1])
    r = xs[rank].to(dev)
    dist.reduce(r, dst=0, group=group)
    ok["reduce"] = torch.equal(r.cpu(), torch.stack(xs).sum(0)) if rank == 0 else torch.equal(r.cpu(), xs[rank])
    outs = [torch.empty(6, device=dev) for _ in range(size)]
    dist.all_gather(outs, xs[rank].to(dev), group=group)
    ok["all_gather"] = all(torch.equal(o.cpu(), x) for o, x in zip(outs, xs))
    big = torch.empty(6 * size, device=dev)
    dist.all_gather_single(big, xs[rank].to(dev), group=group)
    ok["all_gather_single"] = torch.equal(big.cpu(), torch.cat(xs))
    full = [torch.arange(2 * size, dtype=torch.float32) + 10 * q for q in range(size)]
    rs = torch.empty(2, device=dev)
    dist.reduce_scatter_single(rs, full[rank].to(dev), group=group)
    ok["reduce_scatter_single"] = torch.equal(rs.cpu(), torch.stack(full).sum(0)[2 * rank:2 * rank + 2])
    # uneven all-to-all: rank q sends q+1+j rows to rank j
    send_splits = [rank + 1 + j for j in range(size)]
    recv_splits = [q + 1 + rank for q in range(size)]
    src = torch.arange(sum(send_splits), dtype=torch.float32) + 100 * rank
    a2a = torch.empty(sum(recv_splits), device=dev)
    dist.all_to_all_single(a2a, src.to(dev), recv_splits, send_splits, group=group)
    want = torch.cat([(torch.arange(sum(q + 1 + j for j in range(size)), dtype=torch.float32) + 100 * q)
                      [sum(q + 1 + j for j in range(rank)):][:q + 1 + rank] for q in range(size)])
    ok["all_to_all_single uneven"] = torch.equal(a2a.cpu(), want)
    sc = torch.empty(3, device=dev)
    chunks = [torch.full((3,), float(j + 1)).to(dev) for j in range(size)] if rank == 0 else None
    dist.scatter(sc, chunks, src=0, group=group)
    ok["scatter"] = torch.equal(sc.cpu(), torch.full((3,), float(rank + 1)))
    got = [torch.empty(6, device=dev) for _ in range(size)] if rank == 0 else None
    dist.gather(xs[rank].to(dev), got, dst=0, group=group)
    ok["gather"] = all(torch.equal(g.cpu(), x) for g, x in zip(got, xs)) if got is not None else True
    # a ring of sends: each rank sends to the next and receives from the previous
    ring = torch.empty(6, device=dev)
    ops = [dist.P2POp(dist.isend, xs[rank].to(dev), (rank + 1) % size, group),
           dist.P2POp(dist.irecv, ring, (rank - 1) % size, group)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    ok["send/recv ring"] = torch.equal(ring.cpu(), xs[(rank - 1) % size])
    dist.barrier(group=group)
    ok["barrier"] = True
    return ok


def mlp() -> nn.Sequential:
    """The scenarios' model (seeded: every rank and the CPU reference build the same one)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch: 8 rows per rank."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(8 * size, 8, generator=g), torch.randn(8 * size, 4, generator=g)


def _train(net: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> None:
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        opt.step()


def _cpu_reference(size: int, steps: int) -> nn.Module:
    """Single-process CPU training on the whole batch."""
    ref = mlp()
    _train(ref, *_batch(size), steps)
    return ref


def ddp(group: Any, rank: int, size: int, steps: int = 3) -> dict[str, Any]:
    """DDP on each rank's shard against single-process CPU training on the whole batch: the
    largest weight difference after ``steps`` SGD steps, and whether a bucket's all-reduce
    ran while the backward pass's kernels did (small buckets, so there are several)."""
    x, y = _batch(size)
    model = mlp().to("fornax")
    timeline = ft.stack().devices[0].timeline
    since = len(timeline.records)
    net = nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.0001)
    _train(net, x[8 * rank:8 * rank + 8].to("fornax"), y[8 * rank:8 * rank + 8].to("fornax"), steps)
    ref = _cpu_reference(size, steps)
    err = max((a.detach().cpu() - b.detach()).abs().max().item()
              for a, b in zip(model.parameters(), ref.parameters()))
    records = timeline.records[since:]
    kernels = [r for r in records if r.kind == "kernel"]
    overlapped = any(k.start < c.end and c.start < k.end for c in records if c.kind == "collective"
                     for k in kernels)
    return {"max_abs_err": err, "overlap": overlapped}


def fsdp(group: Any, rank: int, size: int, steps: int = 3) -> dict[str, float]:
    """FSDP2 ``fully_shard`` (each Linear, then the root) on each rank's shard of the batch,
    in float32 and with bfloat16 mixed precision (bf16 parameters and compute, fp32 gradient
    reduction), against single-process CPU training in float32: the largest weight
    differences, and the share of the parameters each rank holds."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    x, y = _batch(size)
    ref = _cpu_reference(size, steps)
    tag = _family_tag(group)
    out: dict[str, float] = {}
    for name, policy in (("fp32", MixedPrecisionPolicy()),
                         ("bf16", MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))):
        mesh = DeviceMesh.from_group(group, "fornax", mesh_dim_names=(f"fsdp_{name}_{tag}",))
        model = mlp().to("fornax")
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        params: list[Any] = list(model.parameters())        # DTensors: each rank's shard
        out["local_fraction"] = sum(p.to_local().numel() for p in params) / \
            sum(p.numel() for p in ref.parameters())
        _train(model, x[8 * rank:8 * rank + 8].to("fornax"), y[8 * rank:8 * rank + 8].to("fornax"), steps)
        out[f"{name}_max_abs_err"] = max((p.full_tensor().detach().cpu().float() - q.detach()).abs().max().item()
                                         for p, q in zip(params, ref.parameters()))
    return out


def pipeline(group: Any, rank: int, size: int, microbatches: int = 4) -> dict[str, float]:
    """torch.distributed.pipelining: a stack of Linear+ReLU layers cut into one stage per rank,
    run by the GPipe and the 1F1B schedules (activations and gradients sent between the
    ranks' devices); each microbatch's loss and each stage's gradients against the CPU
    model (the schedules average the gradients over the microbatches)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(2 * microbatches, 8, generator=g), torch.randn(2 * microbatches, 4, generator=g)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((out - target) ** 2).mean()

    def layers() -> list[nn.Module]:
        torch.manual_seed(0)
        mods: list[nn.Module] = []
        for _ in range(size):
            mods += [nn.Linear(8, 8), nn.ReLU()]
        return mods + [nn.Linear(8, 4)]

    ref = nn.Sequential(*layers())
    parts = [loss_fn(ref(xm), ym) for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches))]
    (torch.stack(parts).sum() / microbatches).backward()
    cut = [2 * r for r in range(size)] + [2 * size + 1]
    mine = slice(cut[rank], cut[rank + 1])
    out: dict[str, float] = {}
    for name, schedule in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        stage_module = nn.Sequential(*layers()[mine]).to("fornax")
        stage = PipelineStage(stage_module, rank, size, torch.device("fornax"), group=group)
        run = schedule(stage, n_microbatches=microbatches, loss_fn=loss_fn)
        losses: list[torch.Tensor] = []
        if rank == 0:
            run.step(x.to("fornax"))
        elif rank == size - 1:
            run.step(target=y.to("fornax"), losses=losses)
        else:
            run.step()
        if losses:
            out[f"{name}_loss_max_abs_err"] = max(abs(a.item() - b.item()) for a, b in zip(losses, parts))
        grads = [(p.grad, q.grad) for p, q in zip(stage_module.parameters(), ref[mine].parameters())]
        out[f"{name}_grad_max_abs_err"] = max((a.cpu() - b).abs().max().item()
                                              for a, b in grads if a is not None and b is not None)
    return out


def _family_tag(group: Any) -> str:
    """The family's short name, for DeviceMesh dimension names: DTensor caches plans by mesh
    equality, which compares layouts and names, not groups, and each family's mesh has its
    own groups."""
    pg = fd.process_group(group)
    return pg.family.removesuffix("-like") if pg is not None else "world"


def tensor_parallel(group: Any, rank: int, size: int) -> dict[str, float]:
    """A 1-D DeviceMesh over the group's ranks (2-D, data x tensor, when the world is 4 or
    more and even): the MLP's first Linear ColwiseParallel, its second RowwiseParallel
    (DTensor); forward and gradients against the CPU model.  The largest differences."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    two_d = size >= 4 and size % 2 == 0
    # the mesh is built from fornax groups made on this stack (every rank makes every group)
    tag = _family_tag(group)
    dp_name, tp_name = f"dp_{tag}", f"tp_{tag}"
    if two_d:
        layout = torch.arange(size).reshape(size // 2, 2)
        rows = [dist.new_group(layout[i].tolist(), backend="fornax") for i in range(size // 2)]
        cols = [dist.new_group(layout[:, j].tolist(), backend="fornax") for j in range(2)]
        mesh = DeviceMesh.from_group([cols[rank % 2], rows[rank // 2]], "fornax", mesh=layout,
                                     mesh_dim_names=(dp_name, tp_name))
    else:
        mesh = DeviceMesh.from_group(group, "fornax", mesh_dim_names=(tp_name,))
    tp_mesh = mesh[tp_name]
    model, ref = mlp().to("fornax"), mlp()
    parallelize_module(model, tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4 * size, 8, generator=g)
    dp = mesh.get_local_rank(dp_name) if two_d else 0
    shard = x.chunk(size // 2 if two_d else 1)[dp]
    out = model(shard.to("fornax"))
    fwd = (out.detach().cpu() - ref(shard).detach()).abs().max().item()
    out.sum().backward()
    ref(shard).sum().backward()
    grads: list[Any] = [p.grad for p in model.parameters()]    # DTensors: each rank's shard
    grad = max((g.full_tensor().cpu() - q.grad).abs().max().item()
               for g, q in zip(grads, ref.parameters()))
    return {"mesh": list(mesh.mesh.shape), "forward_max_abs_err": fwd, "grad_max_abs_err": grad}


def overlap(group: Any) -> bool:
    """An async all_reduce and a matmul issued before its ``wait()`` run at the same time on the
    simulated device (the collective on the communication queue, the matmul on the stream)."""
    grad = torch.ones(1 << 16, device="fornax")
    a = torch.ones(256, 256, device="fornax")
    getattr(torch, "fornax").synchronize()       # the device module fornax registers
    work = dist.all_reduce(grad, group=group, async_op=True)
    b = a @ a
    work.wait()
    b.cpu()
    rep = fd.report(group)
    if rep is None:
        raise RuntimeError("the group has no fornax backend")
    rec = rep["collectives"][-1]
    start, end = rec["start_s"], rec["start_s"] + rec["simulated_s"]
    timeline = ft.stack().devices[0].timeline
    kernels = [r for r in timeline.records if r.kind == "kernel" and r.end > start and r.start < end]
    return bool(kernels)


def clocks_meet(group: Any, world: Any, size: int) -> bool:
    """Every rank's last all_reduce ends at the same simulated time."""
    x = torch.ones(1024, device="fornax")
    dist.all_reduce(x, group=group)
    x.cpu()
    rep = fd.report(group)
    if rep is None:
        raise RuntimeError("the group has no fornax backend")
    rec = rep["collectives"][-1]
    end = torch.tensor([rec["start_s"] + rec["simulated_s"]], dtype=torch.float64)
    ends = [torch.empty(1, dtype=torch.float64) for _ in range(size)]
    dist.all_gather(ends, end, group=world)
    return all(abs(e.item() - ends[0].item()) <= 1e-12 for e in ends)


#: what the program checks, in order (``--only`` picks some)
PARTS = ("collectives", "clocks", "overlap", "ddp", "fsdp", "tp", "pp")


def run_family(family: str, world: Any, rank: int, size: int, skip_on: int | None,
               parts: tuple[str, ...] = PARTS, trace: Path | None = None) -> dict[str, Any]:
    ft.use_stack(family, spec="tiny")
    group = dist.new_group(backend="fornax", timeout=timedelta(seconds=20))
    out: dict[str, Any] = {"family": family}
    if "collectives" in parts:
        out["checks"] = collectives(group, rank, size)
    if "clocks" in parts:
        out["clocks_meet"] = clocks_meet(group, world, size)
    if "overlap" in parts:
        out["overlap"] = overlap(group)
    if "ddp" in parts:
        out["ddp"] = ddp(group, rank, size)
    if "fsdp" in parts:
        out["fsdp"] = fsdp(group, rank, size)
    if "tp" in parts:
        out["tensor_parallel"] = tensor_parallel(group, rank, size)
    if "pp" in parts:
        out["pipeline"] = pipeline(group, rank, size)
    if skip_on is not None:
        x = torch.ones(4, device="fornax")
        if rank != skip_on:
            dist.all_reduce(x, group=group)
        try:
            x.cpu()
            out["skip"] = {"error": None}
        except Exception as exc:       # the family's collective error, surfaced at the next wait
            out["skip"] = {"error": str(exc), "type": type(exc).__name__}
    out["backend"] = fd.report(group)
    # the device's race detector watched every kernel, copy and collective of the checks
    out["races"] = [r.to_dict()["message"] for r in ft.stack().devices[0].timeline.races]
    if trace is not None:
        out["trace"] = str(write_rank_trace(trace / family, fd.process_group(group)))
    return out


def summary(r: dict[str, Any]) -> str:
    """One family's results in a line."""
    said = []
    bad = [k for k, v in r.get("checks", {}).items() if not v]
    if "checks" in r:
        said.append(f"{len(r['checks']) - len(bad)}/{len(r['checks'])} collectives match")
    if "clocks_meet" in r:
        said.append(f"clocks meet: {r['clocks_meet']}")
    if "overlap" in r:
        said.append(f"overlap: {r['overlap']}")
    if "ddp" in r:
        said.append(f"DDP vs CPU max |dw| {r['ddp']['max_abs_err']:.2e} (all-reduce overlaps backward: "
                    f"{r['ddp']['overlap']})")
    if "fsdp" in r:
        f = r["fsdp"]
        said.append(f"FSDP2 vs CPU max |dw| {f['fp32_max_abs_err']:.2e} (bf16 mixed {f['bf16_max_abs_err']:.2e}, "
                    f"{f['local_fraction']:.0%} of the parameters per rank)")
    if "tensor_parallel" in r:
        tp = r["tensor_parallel"]
        said.append(f"DTensor TP on mesh {'x'.join(map(str, tp['mesh']))} max |dy| {tp['forward_max_abs_err']:.2e}")
    if "pipeline" in r:
        pp = r["pipeline"]
        said.append(f"pipeline GPipe/1F1B max |dg| {max(pp['gpipe_grad_max_abs_err'], pp['1f1b_grad_max_abs_err']):.2e}")
    said.append(f"{r['backend']['calls']} calls on {r['backend']['library']}")
    return f"{r['family']}: {', '.join(said)}" + (f"; failed: {', '.join(bad)}" if bad else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fornax.scenarios.distributed")
    p.add_argument("--out", type=Path, default=None, help="folder for rank<R>.json")
    p.add_argument("--families", default=",".join(BUILTIN_FAMILIES))
    p.add_argument("--skip-on", type=int, default=None, help="this rank skips the last all_reduce")
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--trace", type=Path, default=None,
                   help="folder for each rank's Perfetto trace (FAMILY/rank<R>.trace.json; "
                        "`fornax trace merge FAMILY_FOLDER` combines them)")
    p.add_argument("--only", default=",".join(PARTS),
                   help=f"the checks to run, comma-separated (default all: {','.join(PARTS)})")
    args = p.parse_args(argv)
    parts = tuple(x.strip() for x in args.only.split(",") if x.strip())
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    dist.init_process_group("cpu:gloo", timeout=timedelta(seconds=args.timeout))
    rank, size = dist.get_rank(), dist.get_world_size()
    world = dist.group.WORLD
    results = [run_family(f, world, rank, size, args.skip_on, parts, args.trace)
               for f in args.families.split(",")]
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"rank{rank}.json").write_text(json.dumps(results, indent=1, default=str))
    if rank == 0:
        for r in results:
            print(summary(r), flush=True)
    if args.skip_on is None:
        dist.destroy_process_group()
    else:                      # the group is broken by design: leave without its shutdown
        os._exit(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
