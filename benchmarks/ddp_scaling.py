"""Scale-out figures: DDP step time on 1, 2 and 4 ranks under torchrun (one process per
simulated H200-like device), the simulated weak-scaling efficiency, and all-reduce bus
bandwidth across the node tier next to the intra-node fabric.

* DDP: an MLP (512-2048-512, 64 rows per rank) trained with DistributedDataParallel over the
  ``fornax`` backend; per step the host wall time and the simulated time of rank 0's device,
  split into compute (kernels) and communication (collectives).  Weak scaling: the per-rank
  batch is fixed, so the ideal step time is the one-rank step; efficiency = T(1) / T(N).
  The topology's ideal communication is the ring all-reduce of the gradients at the
  fabric's bus bandwidth.
* Bus bandwidth: 8 devices in one process, one node (the chip's peer links) and two nodes
  of four (the NIC tier between them), nccl-tests' busbw of a ring all-reduce.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fornax.sim.spec import load_spec
from fornax.sim.topology import Topology
from fornax.stack import compose, make_config

from .results import Figures

RANKS = (1, 2, 4)
SIZES = [1 << k for k in (16, 20, 24, 28)]       # 64 KiB .. 256 MiB
FIGURES = Figures("ddp.{what}[{ranks} ranks]", "ddp.ring_busbw[{nodes}: {size}]",
                  choices={"what": ("host_wall_per_step_s", "simulated_per_step_s", "compute_per_step_s",
                                    "communication_per_step_s", "ideal_communication_s", "efficiency"),
                           "ranks": tuple(map(str, RANKS)), "nodes": ("1 node", "2 nodes")})


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp(nproc: int, family: str = "cuda-like") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
               f"--master-port={_port()}", "-m", "benchmarks.ddp_step", "--family", family, "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                              cwd=Path(__file__).resolve().parents[1])
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun with {nproc} ranks failed:\n{proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def busbw(nodes: int, nbytes: int, vendor: str = "cuda-like") -> float:
    stack = compose(make_config(vendor, devices=8, nodes=nodes, meta=True))
    comm = stack.communicator()
    bufs = [comm.malloc(r, nbytes) for r in range(8)]
    for r in range(8):
        comm.rank(r).all_reduce(bufs[r], bufs[r], nbytes // 4, "float32", algorithm="ring")
    return comm.records[-1].busbw


def main() -> None:
    console = Console()
    rows = [ddp(n) for n in RANKS]
    spec = load_spec("h200-like")
    table = Table(title="DDP step under torchrun, one process per simulated h200-like device "
                        "(cuda-like; weak scaling, 64 rows per rank)")
    for col in ("ranks", "host wall / step", "simulated / step", "compute", "communication",
                "topology ideal comm", "efficiency vs 1 rank"):
        table.add_column(col, justify="right")
    base = rows[0]["simulated_per_step_s"]
    for r in rows:
        n = r["world_size"]
        ideal = Topology.build(spec, n, "switch").allreduce_time(r["gradient_bytes"], "ring") if n > 1 else 0.0
        for what in ("host_wall_per_step_s", "simulated_per_step_s", "compute_per_step_s",
                     "communication_per_step_s"):
            FIGURES.record(f"ddp.{what}[{n} ranks]", r[what], "s")
        FIGURES.record(f"ddp.ideal_communication_s[{n} ranks]", ideal, "s", note="the topology's ring all-reduce")
        FIGURES.record(f"ddp.efficiency[{n} ranks]", base / r["simulated_per_step_s"], "fraction",
                       note="weak scaling, simulated: T(1) / T(N)")
        table.add_row(str(n), f"{r['host_wall_per_step_s'] * 1e3:.1f} ms",
                      f"{r['simulated_per_step_s'] * 1e6:.1f} us", f"{r['compute_per_step_s'] * 1e6:.1f} us",
                      f"{r['communication_per_step_s'] * 1e6:.1f} us", f"{ideal * 1e6:.1f} us",
                      f"{base / r['simulated_per_step_s']:.1%}")
    console.print(table)
    table = Table(title="ring all-reduce bus bandwidth, 8 x h200-like: one node vs two nodes of "
                        f"four over the NIC tier ({spec.nic_bandwidth / 1e9:.0f} GB/s per NIC)")
    for col in ("size", "1 node busbw", "2 nodes busbw"):
        table.add_column(col, justify="right")
    for nbytes in SIZES:
        one, two = busbw(1, nbytes), busbw(2, nbytes)
        FIGURES.record(f"ddp.ring_busbw[1 node: {nbytes >> 10} KiB]", one / 1e9, "GB/s", note="simulated")
        FIGURES.record(f"ddp.ring_busbw[2 nodes: {nbytes >> 10} KiB]", two / 1e9, "GB/s", note="simulated")
        table.add_row(f"{nbytes >> 10} KiB", f"{one / 1e9:.1f} GB/s", f"{two / 1e9:.1f} GB/s")
    console.print(table)


if __name__ == "__main__":
    main()
