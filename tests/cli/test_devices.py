"""`fornax devices`: a stack's simulated devices in the family's own tool style, with figures
that agree with the driver's properties, the chip spec and what the device has run."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fornax.cli.devices import ToolStyle, render, snapshot
from fornax.cli.main import main
from fornax.layers.errors import ConfigError, FornaxError
from fornax.scenarios.workloads import WORKLOADS
from fornax.schemas import validate
from fornax.sim.faults import FaultPlan
from fornax.sim.spec import load_spec
from fornax.stack import compose, get_vendor, make_config
from helpers import FAMILIES

VENDORS = list(FAMILIES)
MIB = 2**20


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def table_texts(facts: dict) -> list[str]:
    """The fixed texts of a family's [tool] table a reader should see: grid header cells and
    column titles (each tab-separated part), and the centred before/after lines."""
    out = []
    for sec in facts["tool"]["sections"]:
        for row in sec.get("header", []):
            out += [p for cell in row for p in cell.split("\t") if p]
        for col in sec.get("columns", []):
            out += [col["title"], col.get("subtitle", "")]
        out += sec.get("before", []) + sec.get("after", [])
    return [t for t in out if t]


# every family on the H200-like chip: what its own tool prints (facts of the real tools' look)
STYLE = {
    "cuda-like": ["NVIDIA-SMI-like 570.86.10", "Driver Version: 570.86.10", "CUDA Version: 12.8",
                  "|   0  fornax h200-like (sm_90)", "00000000:18:00.0 Off"],
    "rocm-like": ["= ROCm-like System Management Interface =", "= Concise Info =",
                  "= End of ROCm-like SMI Log =", "0x74a1,", "1830Mhz"],
    "xpu-like": [("[level_zero:gpu][level_zero:0] fornax Level-Zero-like platform, "
                  "fornax h200-like (pvc) 12.60.7 [1.6.32224]"),
                 "| 0         | Device Name: fornax h200-like (pvc)", "PCI Device ID: 0x0bd5"],
}


@pytest.mark.parametrize("vendor", VENDORS)
def test_each_family_in_its_own_tool_style(vendor):
    code, out, err = run("devices", "--vendor", vendor, "--spec", "h200-like")
    assert code == 0, err
    for text in STYLE[vendor] + table_texts(get_vendor(vendor).facts):
        assert text in out, text
    spec = load_spec("h200-like")
    props = compose(make_config(vendor, spec="h200-like")).driver.properties(0)
    assert f"{spec.board_power_w:.0f}" in out
    assert f"{spec.power['static_w']:.0f}" in out               # an idle device draws static power
    assert f"{spec.power['ambient_c']:.0f}" in out               # ... at the inlet temperature
    if vendor != "rocm-like":                 # rocm-smi's concise view: no name, memory as VRAM%
        assert props.native["name"] in out
        assert f"{props.memory_bytes // MIB}" in out             # capacity in MiB
    if vendor != "cuda-like":                 # nvidia-smi's default view shows no clock
        assert f"{spec.clock_ghz * 1000:.0f}" in out
    others = [s for v in VENDORS if v != vendor for s in STYLE[v][:1]]
    assert not any(s in out for s in others)                     # no other family's banner


def test_the_json_document_agrees_with_the_driver_and_the_spec():
    code, out, _ = run("devices", "--vendor", "xpu-like", "--spec", "tiny", "--devices", "2", "--json")
    assert code == 0
    doc = json.loads(out)
    validate(doc)
    stack = compose(make_config("xpu-like", spec="tiny", devices=2))
    spec = stack.spec
    assert (doc["vendor"], doc["tool"], doc["spec"]) == ("xpu-like", "xpu-smi-like", "tiny")
    assert len(doc["devices"]) == 2
    for i, d in enumerate(doc["devices"]):
        props = stack.driver.properties(i)
        assert d["index"] == i and d["name"] == props.native["name"] and d["target"] == props.target == "dg2"
        assert d["compute_units"] == props.compute_units and d["simd_width"] == props.simd_width
        assert d["memory_total_bytes"] == props.memory_bytes == spec.hbm_bytes
        assert d["memory_used_bytes"] == 0 and d["utilization_pct"] == 0
        assert d["clock_mhz"] == d["max_clock_mhz"] == pytest.approx(spec.clock_ghz * 1000)
        assert d["power_w"] == spec.power["static_w"] and d["power_cap_w"] == spec.board_power_w
        assert d["temperature_c"] == spec.power["ambient_c"]
        assert d["throttle_temp_c"] == spec.power["throttle_temp_c"]
        assert d["native"] == props.native
        assert d["tool"]["ip_version"] == "12.55.8" and d["tool"]["device_id"] == "0x56a0"
    assert [d["bus_id"] for d in doc["devices"]] == ["0000:29:00.0", "0000:43:00.0"]
    assert doc["devices"][0]["uuid"] != doc["devices"][1]["uuid"]


def test_the_uuid_is_the_one_the_framework_face_shows():
    from fornax.layers.face import device_properties
    stack = compose(make_config("cuda-like", spec="tiny", devices=2))
    doc = snapshot(stack)
    face = stack.framework.torch_face
    uuids = [device_properties(face, stack.driver, i, "cuda-like")["uuid"] for i in range(2)]
    assert [d["uuid"] for d in doc["devices"]] == uuids


def test_two_devices_show_two_rows():
    code, out, _ = run("devices", "--vendor", "rocm-like", "--spec", "tiny", "--devices", "2")
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert [r[:2] for r in rows] == [["0", "2"], ["1", "3"]]        # device, KFD node
    assert all(r[2] == "0x740f," for r in rows)                      # gfx90a's device id
    code, out, _ = run("devices", "--vendor", "cuda-like", "--spec", "tiny", "--devices", "2")
    assert "00000000:18:00.0" in out and "00000000:28:00.0" in out
    assert out.count("fornax tiny (sm_80)") == 2


def test_a_config_file_gives_the_stack(tmp_path):
    cfg = tmp_path / "stack.toml"
    cfg.write_text('[stack]\nvendor = "cuda-like"\nspec = "tiny"\ndevices = 3\n')
    code, out, _ = run("devices", "--config", str(cfg), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["vendor"] == "cuda-like" and len(doc["devices"]) == 3 and doc["spec"] == "tiny"


def test_figures_after_a_run_follow_the_device():
    """After a workload: memory the runtime holds, the share of time kernels ran (from the
    driver's own kernel log), average power above static, a warmer chip."""
    stack = compose(make_config("cuda-like", spec="tiny"))
    graph, feeds = WORKLOADS["mlp"].build(0)
    stack.run(graph, feeds)
    (d,) = snapshot(stack)["devices"]
    spec, tl = stack.spec, stack.devices[0].timeline
    assert d["memory_used_bytes"] == stack.runtime.report()["reserved_bytes"] > 0
    kernel_s = sum(k.duration_s for k in stack.driver.kernel_log)
    assert d["utilization_pct"] == pytest.approx(100 * kernel_s / tl.busy_time)
    assert 0 < d["utilization_pct"] < 100
    assert spec.power["static_w"] < d["power_w"] < spec.board_power_w
    assert d["temperature_c"] > spec.power["ambient_c"]


def test_an_uncorrectable_ecc_error_is_counted():
    stack = compose(make_config("cuda-like", spec="tiny"))
    stack.devices[0].inject(FaultPlan.parse("ecc_uncorrectable@1"))
    graph, feeds = WORKLOADS["mlp"].build(0)
    with pytest.raises(FornaxError, match="ECC"):
        stack.run(graph, feeds)
    doc = snapshot(stack)
    assert doc["devices"][0]["ecc_uncorrected"] == 1
    style = ToolStyle(stack.vendors["driver"].facts, "cuda-like")
    ecc_cell = render(doc, style).splitlines()[7].split("|")[3]     # device 0, first line, ECC
    assert ecc_cell.strip() == "1"


def test_bad_input_is_one_line_and_exit_2():
    for args, text in ((["--vendor", "no-such"], "unknown vendor 'no-such'"),
                       ([], "no stack given"),
                       (["--vendor", "cuda-like", "--spec", "no-chip"], "unknown chip spec 'no-chip'"),
                       (["--vendor", "cuda-like", "--devices", "0"], "devices must be a positive integer")):
        code, out, err = run("devices", *args)
        assert code == 2 and out == "" and err.count("\n") == 1, (args, err)
        assert err.startswith("fornax: error: ") and text in err


@pytest.mark.parametrize("vendor", VENDORS)
def test_every_arch_the_driver_names_has_the_tools_fields(vendor):
    facts = get_vendor(vendor).facts
    style = ToolStyle(facts, vendor)
    for target in set(facts["driver"]["arch"].values()):
        assert all(style.field(k, target) not in (None, "") for k in style.fields)


def test_a_long_name_is_shortened_and_the_box_stays_whole():
    facts = copy.deepcopy(get_vendor("cuda-like").facts)
    facts["tool"]["device_name"] = "{native_name} with a marketing name far too long for its cell"
    stack = compose(make_config("cuda-like", spec="tiny", devices=2))
    style = ToolStyle(facts, "cuda-like")
    doc = snapshot(stack, style)
    assert doc["devices"][0]["name"].endswith("too long for its cell")     # the JSON keeps it whole
    lines = render(doc, style).splitlines()
    assert len({len(line) for line in lines}) == 1                         # every line as wide
    (first,) = [line for line in lines if line.startswith("|   0  ")]
    name_cell = first.split("|")[1]
    assert name_cell.endswith("... On ") and name_cell.startswith("   0  fornax tiny (sm_80) with")


def test_a_broken_tool_table_names_what_is_wrong():
    facts = copy.deepcopy(get_vendor("rocm-like").facts)
    stack = compose(make_config("rocm-like", spec="tiny"))
    no_tool = {k: v for k, v in facts.items() if k != "tool"}
    with pytest.raises(ConfigError, match=r"vendor.toml \[tool\]: missing"):
        ToolStyle(no_tool, "rocm-like")
    bad = copy.deepcopy(facts)
    del bad["tool"]["device_ids"]["gfx90a"]
    with pytest.raises(ConfigError, match=r"device_id = '@tool.device_ids.\{target\}'.*no "
                                          r"tool.device_ids.gfx90a"):
        snapshot(stack, ToolStyle(bad, "rocm-like"))
    bad = copy.deepcopy(facts)
    bad["tool"]["device_name"] = "{product}"
    with pytest.raises(ConfigError, match=r"field \{product\} is unknown; fields: .*native_name"):
        snapshot(stack, ToolStyle(bad, "rocm-like"))
    bad["tool"]["device_name"] = "{name.__class__}"
    with pytest.raises(ConfigError, match="not a plain field name"):
        snapshot(stack, ToolStyle(bad, "rocm-like"))
    bad = copy.deepcopy(facts)
    bad["tool"]["sections"][0]["layout"] = "table"
    with pytest.raises(ConfigError, match="layout must be one of grid, columns, lines"):
        ToolStyle(bad, "rocm-like")


def test_as_a_subprocess():
    out = subprocess.run([sys.executable, "-m", "fornax.cli", "devices", "--vendor", "xpu-like",
                          "--spec", "tiny"], check=False, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("[level_zero:gpu][level_zero:0] fornax Level-Zero-like platform, "
                                 "fornax tiny (dg2) 12.55.8 [1.6.32224]")
