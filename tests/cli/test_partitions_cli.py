"""A partitioned chip through the CLI (`fornax devices`, `drill`, `compose`, `qualify`), the
torch device and the JAX client: each partition is a device with its share of the chip, shown
in each family's own tool style, and a fault drill on one partition leaves the neighbour
running or takes the chip down as the mode says."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.scenarios import drill as d
from fornax.schemas import validate
from fornax.sim.chip import Chip
from fornax.sim.spec import load_spec
from fornax.stack import compose, make_config

MIB = 2**20


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("vendor,spec,layout,texts", [
    ("cuda-like", "h100-like", "3g.40gb,2g.20gb",
     ["MIG devices:", "GPU  GI  CI  MIG", "\tEnabled", "| 60      0 |  3   0    3    0    3 |"]),
    ("rocm-like", "mi300x-like", "cpx/nps4",
     ["Partition Info", "ACCELERATOR_TYPE", "NPS4    CPX               7             38"]),
    ("xpu-like", "max1550-like", "flat",
     ["ZE_FLAT_DEVICE_HIERARCHY=FLAT: root device 1 = stack(s) 1 (64 Xe cores",
      "[level_zero:gpu][level_zero:1]"]),
])
def test_devices_shows_the_partitions_in_the_family_style(vendor, spec, layout, texts):
    code, out, err = run("devices", "--vendor", vendor, "--spec", spec, "--partition", layout)
    assert code == 0, err
    for text in texts:
        assert text.replace("\t", "") in out.replace("\t", ""), text
    code, js, _ = run("devices", "--vendor", vendor, "--spec", spec, "--partition", layout, "--json")
    doc = json.loads(js)
    validate(doc)
    stack = compose(make_config(vendor, spec=spec, partition=layout))
    parts = doc["partition"]["partitions"]
    assert len(parts) == len(doc["devices"]) == len(stack.devices) > 1
    for rec, part, dev in zip(parts, doc["devices"], stack.devices):
        assert rec["memory_total_mib"] == dev.spec.hbm_bytes // MIB == part["memory_total_bytes"] // MIB
        assert rec["compute_units"] == part["compute_units"] == dev.spec.compute_units
    assert doc["partition"]["select"] and doc["partition"]["source"]
    assert len({dev["bus_id"] for dev in doc["devices"]}) == 1     # one chip, one PCI address
    if vendor == "cuda-like":                  # cudaDeviceProp.name of a MIG device
        assert doc["devices"][0]["name"] == "fornax h100-like (sm_90) MIG 3g.40gb"
        chip = doc["partition"]["chip"]        # nvidia-smi lists the GPU once, MIG mode on
        assert chip["memory_total_bytes"] == load_spec(spec).hbm_bytes
        assert chip["name"] == "fornax h100-like (sm_90)" and out.count("Enabled") == 1
    else:
        assert "chip" not in doc["partition"]
    plain = json.loads(run("devices", "--vendor", vendor, "--spec", spec, "--json")[1])
    assert "partition" not in plain


def test_a_partition_the_chip_lacks_is_exit_2_with_the_choices():
    code, _, err = run("devices", "--vendor", "cuda-like", "--spec", "h100-like", "--partition", "3g.45gb")
    assert code == 2 and "it takes: mig profiles 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb" in err
    code, _, err = run("drill", "--vendor", "cuda-like", "--fault", "ecc_uncontained")
    assert code == 2 and "unknown fault 'ecc_uncontained'" in err


def test_the_report_and_the_trace_name_the_partition(tmp_path):
    trace = tmp_path / "run.json"
    code, out, err = run("compose", "--vendor", "rocm-like", "--spec", "mi300x-like", "--partition",
                         "qpx/nps4", "--workload", "mlp", "--json", "--trace", str(trace))
    assert code == 0, err
    names = [e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"]
             if e.get("name") == "process_name"]
    assert names == [f"device {i} (mi300x-like, QPX partition {i})" for i in range(4)]
    rep = json.loads(out)
    validate(rep)
    part = rep["manifest"]["partition"]
    assert (part["layout"], part["mode"], part["memory_mode"], len(part["partitions"])) == (
        "qpx/nps4", "qpx", "nps4", 4)
    assert rep["costs"]["spec_hbm_bytes"] == part["partitions"][0]["hbm_bytes"] == 48_000_000_000 // 65536 * 65536
    code, out, _ = run("compose", "--vendor", "rocm-like", "--spec", "mi300x-like", "--partition",
                       "qpx/nps4", "--workload", "mlp")
    assert code == 0 and "partition: qpx/nps4 (4 partition(s))" in out


def test_the_torch_device_and_the_jax_client_are_a_partition():
    import torch

    import fornax.frameworks.torch as ft
    from fornax.frameworks.jax import Client
    stack = compose(make_config("cuda-like", spec="h100-like", partition="3g.40gb,4g.40gb"))
    ft.use_stack(stack=stack)
    props = torch.fornax.get_device_properties(0)
    assert props.name == "fornax h100-like (sm_90) MIG 4g.40gb"
    assert (props.multi_processor_count, props.total_memory) == (64, stack.devices[0].spec.hbm_bytes)
    assert torch.fornax.device_count() == 1          # the torch face is partition 0, as a CUDA
    #                                                  process sees the one MIG device it runs on
    x = torch.arange(8.0, device="fornax")
    assert (x * 2).cpu().tolist() == [2.0 * i for i in range(8)]
    assert stack.devices[0].memory.used > 0 and stack.devices[1].memory.used == 0
    client = Client(compose(make_config("rocm-like", spec="mi300x-like", partition="cpx")))
    assert len(client.devices()) == 8
    assert client.devices()[3].device_kind.endswith("(CPX partition 3: 38 units, 24.0 GB at 0.66 TB/s)")
    buf = client.buffer_from_pyval(np.ones(4, np.float32))
    assert buf.to_numpy().tolist() == [1.0] * 4


def _rows(doc):
    return {(r["family"], r["fault"], r["front_end"]): r for r in doc["rows"]}


def test_a_drill_on_one_partition():
    code, out, err = run("drill", "--vendor", "cuda-like", "--spec", "h100-like", "--partition",
                         "3g.40gb,4g.40gb", "--front-end", "graph", "--fault", "ecc_uncorrectable",
                         "--fault", "ecc_uncontained", "--fault", "page_fault", "--json")
    assert code == 0, err
    doc = json.loads(out)
    validate(doc)
    rows = _rows(doc)
    contained = rows[("cuda-like", "ecc_uncorrectable", "graph")]
    assert contained["code"] == "CUDA_ERROR_ECC_UNCORRECTABLE"
    assert contained["partition"]["scope"] == "partition"
    assert contained["partition"]["neighbour"] == "running (0 of 1 other partition(s) lost)"
    full = rows[("cuda-like", "ecc_uncontained", "graph")]
    assert full["partition"]["scope"] == "device" and full["recovery"].startswith("chip reset")
    assert full["partition"]["neighbour"] == "down (1 of 1 other partition(s) lost)"
    assert full["partition"]["neighbour_after"] == "identical" and full["ok"]
    other = d.drill(("ecc_uncorrectable", "hang"), ["rocm-like", "xpu-like"], ["graph"],
                    partition="cpx", spec="mi300x-like")
    assert other["failed"] == 0
    scopes = {k[:2]: r["partition"]["scope"] for k, r in _rows(other).items()}
    # amdgpu resets the whole GPU for an uncorrectable error; a hung queue stays in its partition
    assert scopes[("rocm-like", "ecc_uncorrectable")] == "device"
    assert scopes[("rocm-like", "hang")] == scopes[("xpu-like", "hang")] == "partition"
    torch_row = d.drill_row("device_lost", "xpu-like", "torch", spec="max1550-like", partition="flat")
    assert torch_row.ok and torch_row.code == "ZE_RESULT_ERROR_DEVICE_LOST"
    assert torch_row.partition["neighbour"] == "down (1 of 1 other partition(s) lost)"


def test_the_drill_fails_a_chip_that_does_not_spread_an_uncontained_error(monkeypatch):
    monkeypatch.setattr(Chip, "spread", lambda self, origin, fault: None)
    row = d.drill_row("ecc_uncontained", "cuda-like", "graph", spec="h100-like", partition="1g.10gb:2")
    assert not row.ok and row.partition["scope"] == "device"
    assert row.partition["neighbour"].startswith("running") and not row.partition["isolated"]
    code, out, _ = run("drill", "--vendor", "cuda-like", "--spec", "h100-like", "--partition",
                       "1g.10gb:2", "--front-end", "graph", "--fault", "ecc_uncontained")
    assert code == 1 and "yes yes yes NO" in out and "FAILED ecc_uncontained / cuda-like" in out


def test_qualify_on_a_partition():
    code, out, err = run("qualify", "--vendor", "cuda-like", "--partition", "3g.71gb,4g.71gb",
                         "--level", "L0", "--json")
    assert code == 0, err
    doc = json.loads(out)
    level = next(lv for lv in doc["levels"] if lv["level"] == "L0")
    assert level["status"] == "pass"
    assert any("MIG 4g.71gb" in e["detail"] for e in level["evidence"])
