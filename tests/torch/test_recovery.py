"""Checkpointing and recovery under torchrun: FSDP2 training on fornax saves sharded state
with torch.distributed.checkpoint; a device lost (or a link failed) on one rank makes every
rank fail with its family's error instead of hanging; ``torchrun --max-restarts 1`` starts
the job again, it resumes from the last checkpoint and ends where an uninterrupted run ends."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import free_port
from fornax.scenarios.recovery import cpu_losses

STEPS = ["--steps", "4", "--checkpoint-every", "2", "--fail-at", "3", "--fail-rank", "1"]


def run(tmp_path, name: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """torchrun (2 ranks, one restart allowed); the records it left, by attempt/rank."""
    root = tmp_path / name
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=1",
           f"--master-port={free_port()}", "-m", "fornax.scenarios.recovery", *STEPS,
           "--checkpoint", str(root / "ckpt"), "--out", str(root / "out"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    records = {f"{p.parent.name}/{p.stem}": json.loads(p.read_text())
               for p in sorted((root / "out").glob("*/rank*.json"))}
    return proc, records


def test_a_lost_device_fails_every_rank_and_the_restart_ends_where_an_uninterrupted_run_does(tmp_path):
    proc, rec = run(tmp_path, "lost", "--family", "cuda-like", "--fail", "device_lost")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lost, peer = rec["attempt0/rank1"], rec["attempt0/rank0"]
    assert "device 0 was lost" in lost["error"] and "cuStreamSynchronize" in lost["error"]
    # the other rank's collective fails with NCCL's remote error, naming the call and its number
    assert "ncclRemoteError (6)" in peer["error"] and "(seq " in peer["error"]
    final = [rec["final/rank0"], rec["final/rank1"]]
    assert all(f["attempt"] == 1 and f["resumed_from"] == 2 for f in final)
    assert sorted(final[0]["losses"]) == ["2", "3"]
    _, clean = run(tmp_path, "clean", "--family", "cuda-like")
    ref = clean["final/rank0"]
    assert ref["attempt"] == 0 and ref["resumed_from"] is None
    assert final[0]["weights"] == ref["weights"]                 # bit for bit
    assert final[0]["losses"]["3"] == ref["losses"]["3"]
    want = cpu_losses(4, 2)
    assert [ref["losses"][str(s)] for s in range(4)] == pytest.approx(want, rel=1e-5)


def test_a_failed_link_fails_the_same_collective_on_every_rank(tmp_path):
    proc, rec = run(tmp_path, "link", "--family", "xpu-like", "--fail", "link_failure")
    assert proc.returncode == 0, proc.stderr[-3000:]
    failing, peer = rec["attempt0/rank1"]["error"], rec["attempt0/rank0"]["error"]
    assert "link failure" in failing and "failed on this rank" in failing
    assert "rank 1 reported: link failure" in peer
    # oneCCL-like's code on both, at the same call and sequence number
    call = failing.split("failed on this rank")[0].rsplit("] ", 1)[1]
    assert call.split(",")[0] in peer and "runtime_error" in failing and "runtime_error" in peer
    final = rec["final/rank0"]
    assert final["attempt"] == 1 and final["resumed_from"] == 2
    assert [final["losses"][str(s)] for s in (2, 3)] == pytest.approx(cpu_losses(4, 2)[2:], rel=1e-5)
