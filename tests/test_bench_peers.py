"""benchmarks/peers.py without the peers: the fornax and torch CPU rows of the add workload
compute the right values and report positive times (the peers, an optional extra, are skipped)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import peers

ADD = "add 1,024 f32"
FORNAX = [r.name for r in peers.runners() if r.name.startswith("fornax ")]


def test_fornax_add_matches_torch_cpu():
    w = peers._workload(ADD)
    inp = peers.make_inputs(w)
    cpu = peers.run_once(ADD, "torch CPU")
    assert cpu.dtype == np.float32 and cpu.shape == (1024,)
    np.testing.assert_array_equal(cpu, peers.reference(w, inp))
    for name in FORNAX:
        np.testing.assert_array_equal(peers.run_once(ADD, name), cpu, err_msg=name)


def test_fornax_and_torch_rows_have_positive_times():
    rows = peers.measure([ADD], [*FORNAX, "torch CPU"], budget_s=5.0)
    assert [r["runner"] for r in rows] == [*FORNAX, "torch CPU"]
    for r in rows:
        assert r["workload"] == ADD
        assert r["status"] == "measured" and not r["reduced"], r
        assert r["correct"] and r["max_abs_err"] == 0.0, r
        assert r["seconds"] > 0 and r["ratio"] > 0, r
    assert min(r["ratio"] for r in rows if r["runner"] in FORNAX) == pytest.approx(1.0)


def test_missing_peer_is_reported_not_raised(monkeypatch):
    """A peer that is not installed becomes a row saying so (the test environment lacks them;
    the lookup is forced so the test holds where the extra is installed too)."""
    monkeypatch.setattr(peers.importlib.util, "find_spec", lambda name, *a: None)
    rows = peers.measure([ADD], ["tinygrad PYTHON", "triton interpreter", "numba CUDA sim"])
    assert [r["status"] for r in rows] == [peers.NOT_INSTALLED] * 3
    assert all(r["seconds"] is None and r["ratio"] is None for r in rows)
