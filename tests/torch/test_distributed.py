"""torch.distributed on fornax: the ``fornax`` backend under torchrun, one process per rank,
each simulating its own device — every collective against its CPU result, the ranks'
simulated clocks meeting at each collective, DDP against single-process CPU training, on
every family, FSDP2, DTensor tensor parallelism and pipeline stages; two nodes over the NIC tier; a rank that skips a collective fails the others
with the family's error."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

from docs_blocks import ROOT, same_output, shown_after
from helpers import free_port
import fornax.frameworks.torch  # noqa: F401  (registers the device and the backend)
from fornax.frameworks.torch import distributed as fd
from fornax.layers.collectives.order import reduce_in_order
from fornax.layers.errors import FornaxError
from fornax.sim import trace_merge
from fornax.sim.spec import load_spec
from fornax.stack import BUILTIN_FAMILIES, get_vendor

LIBRARIES = {f: get_vendor(f).facts["library"]["collectives"]["name"] for f in BUILTIN_FAMILIES}


def torchrun(tmp_path, nproc: int, *args: str, timeout: int = 300) -> tuple[subprocess.CompletedProcess, list]:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           f"--master-port={free_port()}", "-m", "fornax.scenarios.distributed", "--out", str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)
             if (out / f"rank{r}.json").exists()]
    return proc, ranks


def test_two_ranks_under_torchrun_on_every_family(tmp_path):
    proc, ranks = torchrun(tmp_path, 2, "--trace", str(tmp_path / "traces"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(ranks) == 2
    for rank, results in enumerate(ranks):
        assert [r["family"] for r in results] == list(BUILTIN_FAMILIES)
        for r in results:
            failed = [k for k, ok in r["checks"].items() if not ok]
            assert not failed and len(r["checks"]) == 15, (r["family"], failed)
            assert r["clocks_meet"] and r["overlap"], r["family"]
            # DDP matches CPU, and its buckets' all-reduces overlap the backward pass
            assert r["ddp"]["max_abs_err"] < 1e-6 and r["ddp"]["overlap"], r["family"]
            assert r["races"] == [], r["family"]       # FSDP2's streams ordered by events
            fs = r["fsdp"]           # sharded: each rank holds half; bf16 compute is looser
            assert fs["local_fraction"] == 0.5 and fs["fp32_max_abs_err"] < 1e-6, (r["family"], fs)
            assert 1e-6 < fs["bf16_max_abs_err"] < 5e-3, (r["family"], fs)
            tp = r["tensor_parallel"]
            assert tp["mesh"] == [2] and tp["forward_max_abs_err"] < 1e-5 and tp["grad_max_abs_err"] < 1e-5
            pp = r["pipeline"]        # stage gradients on both ranks, losses on the last
            assert max(pp.values()) < 1e-6 and ("gpipe_loss_max_abs_err" in pp) == (rank == 1), pp
            b = r["backend"]
            assert b["backend"] == "fornax" and b["library"] == LIBRARIES[r["family"]]
            assert b["face_backend"] == {"cuda-like": "nccl", "rocm-like": "nccl", "xpu-like": "xccl"}[r["family"]]
            assert b["rank"] == rank and b["world_size"] == 2 and b["calls"] == len(b["collectives"])
            calls = {c["call"] for c in b["collectives"]}
            facts = get_vendor(r["family"]).facts["library"]["collectives"]["calls"]
            assert facts["all_reduce"] in calls and facts["all_gather"] in calls
            for c in b["collectives"]:
                assert c["simulated_s"] > 0 and c["bytes"] >= 0
                if c["op"] == "all_reduce" and c["bytes"]:
                    assert c["busbw_gbps"] == pytest.approx(c["algbw_gbps"] * 2 * (2 - 1) / 2)
    # both ranks recorded the same collectives, at the same simulated start times (a pipeline
    # stage's send is its peer's recv)
    p2p = {"send": "p2p", "recv": "p2p"}
    for a, b in zip(ranks[0], ranks[1]):
        sa = [(c["seq"], p2p.get(c["op"], c["op"]), round(c["start_s"], 15)) for c in a["backend"]["collectives"]]
        sb = [(c["seq"], p2p.get(c["op"], c["op"]), round(c["start_s"], 15)) for c in b["backend"]["collectives"]]
        assert [s[:2] for s in sa] == [s[:2] for s in sb]
        assert [s[2] for s in sa if s[1] != "p2p"] == [s[2] for s in sb if s[1] != "p2p"]
    assert "cuda-like: 15/15 collectives match, clocks meet: True, overlap: True" in proc.stdout
    # what docs/distributed.md shows is what the program prints
    shown = shown_after(ROOT / "docs" / "distributed.md", "Output (rank 0's summary")
    # (the max-error figures at round-off level depend on the host's BLAS: below 1e-6 any is shown)
    assert same_output(proc.stdout, shown, roundoff=1e-6), \
        f"docs/distributed.md's output changed; now:\n{proc.stdout}"
    # the ranks' traces merge: every collective of the family's group is matched on both ranks
    traces = [json.loads((tmp_path / "traces" / "rocm-like" / f"rank{r}.trace.json").read_text())
              for r in (0, 1)]
    summary = trace_merge.summary(traces)
    assert summary["unmatched"] == [] and summary["mismatched"] == []
    group = ranks[0][1]["backend"]
    matched = [c for c in summary["collectives"] if c["ranks"] == [0, 1]]
    assert len(matched) == sum(1 for c in group["collectives"] if c["op"] not in ("send", "recv"))
    merged = trace_merge.merge(traces)
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    assert sorted(names) == [1, 2] and names[2].startswith("rank 1 · rocm-like")


def test_four_ranks_and_a_two_d_mesh(tmp_path):
    proc, ranks = torchrun(tmp_path, 4, "--families", "xpu-like", "--only", "collectives,clocks,tp,pp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for results in ranks:
        (r,) = results
        assert all(r["checks"].values()) and r["clocks_meet"] and "ddp" not in r
        tp = r["tensor_parallel"]
        assert tp["mesh"] == [2, 2] and tp["forward_max_abs_err"] < 1e-5 and tp["grad_max_abs_err"] < 1e-5
        assert max(r["pipeline"].values()) < 1e-6          # four stages, GPipe and 1F1B
        assert r["backend"]["world_size"] == 4 and r["backend"]["library"] == "oneccl-like"
        # four ranks over the switch: the ring all-reduce's bus factor is 2(n-1)/n
        ar = [c for c in r["backend"]["collectives"] if c["op"] == "all_reduce" and c["bytes"] >= 4096]
        assert ar and all(c["busbw_gbps"] == pytest.approx(c["algbw_gbps"] * 1.5) for c in ar)


def test_two_nodes_on_one_machine_and_a_rank_that_skips_a_collective(tmp_path):
    """torchrun --nnodes 2 (one rank per node, static rendezvous on this machine): the ranks
    are on different nodes, so the fabric between them is the NIC tier of the chip spec.  At
    the end rank 1 skips an all_reduce: rank 0's fails with the family's collective error,
    naming the call, its sequence number and the rank, instead of hanging."""
    port, out = free_port(), tmp_path / "out"
    cmds = [[sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
             f"--node-rank={r}", "--master-addr=127.0.0.1", f"--master-port={port}",
             "-m", "fornax.scenarios.distributed", "--families", "rocm-like", "--only", "collectives,clocks,overlap",
             "--skip-on", "1", "--timeout", "5", "--out", str(out)]
            for r in (0, 1)]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
             for c in cmds]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs[0][-2000:] + errs[1][-2000:]
    tiny = load_spec("tiny")                 # the scenario's chip
    for r in (0, 1):
        (res,) = json.loads((out / f"rank{r}.json").read_text())
        assert all(res["checks"].values()) and res["clocks_meet"] and res["overlap"]
        b = res["backend"]
        assert b["node_of"] == [0, 1] and b["topology"]["nodes"] == 2
        assert b["topology"]["nic_bandwidth"] == tiny.nic_bandwidth
        big = [c for c in b["collectives"] if c["op"] == "all_reduce" and c["bytes"] >= 1 << 18]
        assert big and all(c["busbw_gbps"] <= tiny.nic_bandwidth / 1e9 for c in big)
        assert b["library"] == "rccl-like"
    err = json.loads((out / "rank0.json").read_text())[0]["skip"]["error"]
    assert err is not None and "ncclRemoteError" in err and "ncclAllReduce (seq" in err
    assert "rank 0 of 2" in err and "GLHF" not in err and ".cc:" not in err
    # the flight recorder names the rank that never reached the call, and where it is
    seq = int(err.split("ncclAllReduce (seq ")[1].split(",")[0])
    assert f"rank 1 is at seq {seq - 1} (" in err
    assert json.loads((out / "rank1.json").read_text())[0]["skip"]["error"] is None


def test_summation_order_is_the_in_process_communicators():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(1001).astype(np.float32) for _ in range(4)]
    ring = reduce_in_order(xs, "sum", "ring")
    # chunk c starts at rank c+1 and goes round the ring
    for c, idx in enumerate(np.array_split(np.arange(1001), 4)):
        acc = xs[(c + 1) % 4][idx]
        for k in range(2, 5):
            acc = acc + xs[(c + k) % 4][idx]
        assert np.array_equal(ring[idx], acc)
    assert np.array_equal(reduce_in_order(xs, "sum", "tree"), (xs[0] + xs[1]) + (xs[2] + xs[3]))
    assert np.array_equal(reduce_in_order(xs, "max"), np.maximum.reduce(xs))
    assert np.array_equal(reduce_in_order([np.array([7, 9])] * 2, "avg"), np.array([7, 9]))
    with pytest.raises(ValueError):
        reduce_in_order(xs, "median")


@pytest.fixture
def world_of_one():
    dist.init_process_group("fornax", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=10))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_a_world_of_one_and_clear_errors(world_of_one):
    x = torch.arange(5, dtype=torch.float32, device="fornax")
    dist.all_reduce(x)
    assert torch.equal(x.cpu(), torch.arange(5, dtype=torch.float32))
    rep = fd.report()
    assert rep["world_size"] == 1 and rep["calls"] == 1 and rep["collectives"][0]["simulated_s"] == 0.0
    cpu = torch.full((2,), 3.0)
    dist.all_reduce(cpu)                   # CPU tensors take the group's gloo half
    assert torch.equal(cpu, torch.full((2,), 3.0)) and fd.report()["calls"] == 1
    with pytest.raises(FornaxError, match="takes fornax tensors"):
        dist.all_gather([torch.empty(2)], torch.ones(2, device="fornax"))
    with pytest.raises(FornaxError, match="not supported"):
        dist.all_reduce(torch.ones(2, device="fornax"), op=dist._make_nccl_premul_sum(2.0))


def test_a_local_rank_device_index_under_torchrun_says_what_to_use(monkeypatch):
    """Each rank's process simulates one device, as with one GPU visible per process: a
    CUDA-style ``fornax:LOCAL_RANK`` is refused with what to write instead."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(fornax.frameworks.torch.DeviceError, match=r"not LOCAL_RANK \(1\)"):
        torch.ones(2, device="fornax:1")
    assert torch.ones(2, device="fornax:0").device == torch.device("fornax", 0)
