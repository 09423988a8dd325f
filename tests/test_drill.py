"""``fornax drill``: every injectable fault on every family through every front end is
detected with the family's exact code, recovered the way the family recovers, and the
results after recovery are bit-identical to a clean run; migration is told from a hang."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.scenarios import drill as d
from fornax.schemas import validate
from fornax.stack import compose, make_config
from helpers import FAMILIES

VENDORS = FAMILIES

#: the codes the real stacks raise (cuda-like/rocm-like: sticky context; xpu-like: device lost)
EXACT = {
    ("cuda-like", "page_fault"): "CUDA_ERROR_ILLEGAL_ADDRESS",
    ("cuda-like", "hang"): "CUDA_ERROR_LAUNCH_TIMEOUT",
    ("cuda-like", "ecc_uncorrectable"): "CUDA_ERROR_ECC_UNCORRECTABLE",
    ("cuda-like", "out_of_memory"): "cudaErrorMemoryAllocation",
    ("rocm-like", "page_fault"): "hipErrorIllegalAddress",
    ("rocm-like", "hang"): "hipErrorLaunchTimeOut",
    ("rocm-like", "out_of_memory"): "hipErrorOutOfMemory",
    ("xpu-like", "page_fault"): "ZE_RESULT_ERROR_DEVICE_LOST",
    ("xpu-like", "hang"): "ZE_RESULT_ERROR_DEVICE_LOST",
    ("xpu-like", "device_lost"): "ZE_RESULT_ERROR_DEVICE_LOST",
}


def _check(doc: dict) -> None:
    bad = [r for r in doc["rows"] if not r["ok"]]
    assert not bad, bad
    for r in doc["rows"]:
        want = EXACT.get((r["family"], r["fault"]))
        if want is not None:
            assert r["code"] == want, r
        if r["fault"] in ("ecc_correctable", "migration"):
            assert r["code"] is None and "no watchdog" in r["detail"] or r["fault"] != "migration"
        else:
            assert r["code"] in r["expected"], r


def test_graph_front_end_every_fault_every_family():
    doc = d.drill(d.FAULTS, VENDORS, ("graph",))
    validate(doc)
    assert len(doc["rows"]) == len(d.FAULTS) * len(VENDORS)
    _check(doc)
    recoveries = {(r["family"], r["fault"]): r["recovery"] for r in doc["rows"]}
    # each family recovers its own way: CUDA/HIP destroy the sticky context, Level Zero resets
    assert recoveries[("cuda-like", "hang")].startswith("new context: cudaDeviceReset")
    assert recoveries[("xpu-like", "hang")].startswith("device reset: zesDeviceReset")
    assert recoveries[("rocm-like", "device_lost")].startswith("device reset")


@pytest.mark.parametrize("family,front", [("rocm-like", "torch"), ("xpu-like", "jax"),
                                          ("cuda-like", "torch"), ("cuda-like", "jax")])
def test_framework_front_ends(family, front):
    faults = d.FAULTS if family != "cuda-like" else ("page_fault", "device_lost", "out_of_memory")
    doc = d.drill(faults, (family,), (front,))
    assert len(doc["rows"]) == len([f for f in faults if f != "migration"])
    _check(doc)


def test_migration_is_told_from_a_hang():
    mig = d.drill_row("migration", "cuda-like", "graph")
    hang = d.drill_row("hang", "cuda-like", "graph")
    assert mig.ok and mig.code is None and "page migration(s)" in mig.detail
    assert "no watchdog" in mig.detail and not mig.detail.startswith("migrate: 0 ")
    assert hang.ok and hang.code == "CUDA_ERROR_LAUNCH_TIMEOUT" and "watchdog" in hang.detail


def test_a_tensor_from_before_a_reset_is_a_clear_error():
    import torch

    import fornax.frameworks.torch as ft
    from fornax.layers.errors import FornaxError
    session = ft.use_stack(stack=compose(make_config("rocm-like")))
    old = torch.ones(8, device="fornax")
    session.reset_device("a drill")
    with pytest.raises(FornaxError, match="destroyed when the device was reset after a drill"):
        (old + 1).cpu()
    fresh = torch.ones(8, device="fornax") * 3
    assert fresh.cpu().tolist() == [3.0] * 8
    del old                                # dropped without a free into the new context
    assert session.runtime.memory_stats()["allocated_bytes"] > 0


def test_a_jax_buffer_from_before_a_reset_is_a_clear_error():
    from fornax.frameworks.jax import Client
    from fornax.layers.errors import FornaxError
    client = Client(compose(make_config("xpu-like")))
    buf = client.buffer_from_pyval(np.arange(4, dtype=np.float32))
    client.reset_device("a drill")
    with pytest.raises(FornaxError, match="destroyed when the device was reset"):
        buf.to_numpy()
    again = client.buffer_from_pyval(np.arange(4, dtype=np.float32))
    assert again.to_numpy().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_cli_json_trace_and_exit_codes(tmp_path, monkeypatch):
    r = CliRunner().invoke(main, ["drill", "--vendor", "xpu-like", "--front-end", "graph", "--fault",
                                  "hang", "--fault", "migration", "--json", "--trace", str(tmp_path)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    validate(doc)
    assert [row["fault"] for row in doc["rows"]] == ["hang", "migration"]
    trace = json.loads((tmp_path / "drill-hang-xpu-like-graph.json").read_text())
    assert any(e.get("name") == "fault" for e in trace["traceEvents"])
    assert CliRunner().invoke(main, ["drill", "--fault", "meltdown"]).exit_code == 2

    def failing(fault, family, front_end, spec=None, trace=None):
        return d.DrillRow(fault, family, front_end, code="X", expected=["Y"], detail="wrong code")
    monkeypatch.setattr(d, "drill_row", failing)
    r = CliRunner().invoke(main, ["drill", "--vendor", "cuda-like", "--front-end", "graph",
                                  "--fault", "hang"])
    assert r.exit_code == 1 and "FAILED hang / cuda-like / graph: wrong code" in r.output
