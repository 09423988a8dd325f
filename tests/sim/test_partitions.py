"""Device partitioning: the chips' partition modes as data, layouts checked against them,
each partition a device with its share of the chip in the cost model, memory isolation, and
the fault scopes each family's mode states (a fault stays in its partition or takes the chip
down until it is reset)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fornax.layers.errors import ConfigError, FornaxError
from fornax.sim.cost import kernel_cost
from fornax.sim.counters import Counters
from fornax.sim.faults import FaultPlan, FaultSpec, SpecError
from fornax.sim.layout import layout
from fornax.sim.partition import parse_partitions
from fornax.sim.spec import load_spec
from fornax.stack import compose, load_config, make_config

SPECS = Path(__file__).resolve().parents[2] / "fornax" / "sim" / "specs"


@pytest.fixture(scope="module")
def h100():
    return load_spec("h100-like")


def test_each_chip_declares_its_real_modes():
    h100, h200 = load_spec("h100-like"), load_spec("h200-like")
    mig = h100.partitions.modes["mig"]
    assert list(mig.profiles) == ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert list(h200.partitions.modes["mig"].profiles) == [
        "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]
    assert (mig.compute_slices, mig.memory_slices, mig.peer) == (7, 8, False)
    assert [p.max_instances for p in mig.profiles.values()] == [7, 4, 3, 2, 1, 1]
    assert "MIG user guide" in h100.partitions.source
    amd = load_spec("mi300x-like").partitions
    assert {n: (m.instances, m.memory) for n, m in amd.modes.items()} == {
        "spx": (1, ("nps1",)), "dpx": (2, ("nps1",)), "qpx": (4, ("nps1", "nps4")),
        "cpx": (8, ("nps1", "nps4"))}
    assert amd.modes["cpx"].profiles["cpx"].compute_units == 38
    intel = load_spec("max1550-like").partitions
    assert (intel.modes["flat"].instances, intel.modes["composite"].sub_devices) == (2, 2)
    assert load_spec("tiny").partitions is None


@pytest.mark.parametrize("chip,text,message", [
    ("h100-like", "5g.50gb", "valid|it takes: mig profiles 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb"),
    ("h100-like", "3g.40gb:3", "at most 2 3g.40gb"),
    ("h100-like", "1g.10gb:999999999999", "COUNT must be 1 to 64"),
    ("h100-like", "1g.10gb:0", "COUNT must be 1 to 64"),
    ("h100-like", "3g.40gb,,", "cannot read partition ''"),
    ("h100-like", "4g.40gb,3g.40gb,1g.10gb", "needs 8 compute and 9 memory slices; h100-like has 7 and 8"),
    ("h100-like", "mig", "split by listing its profiles"),
    ("h100-like", "cpx", "unknown partition 'cpx' for h100-like"),
    ("mi300x-like", "spx/nps4", "does not pair with spx on mi300x-like; valid: spx/nps1"),
    ("mi300x-like", "cpx/nps2", "valid: cpx/nps1, cpx/nps4"),
    ("tiny", "cpx", "declares no partition modes"),
])
def test_a_layout_the_chip_lacks_is_refused_with_the_valid_ones(chip, text, message):
    with pytest.raises(SpecError, match="|".join(f"(?:{m})" for m in message.split("|"))):
        layout(load_spec(chip), text)


def test_layouts_place_and_name_their_partitions(h100):
    mixed = layout(h100, "1g.10gb,3g.40gb,2g.20gb,1g.10gb")
    assert mixed.text == "3g.40gb,2g.20gb,1g.10gb:2"          # largest first, as placed
    assert [p.slice_start for p in mixed.partitions] == [0, 3, 5, 6]
    assert [p.label for p in mixed.partitions][:2] == ["MIG 3g.40gb", "MIG 2g.20gb"]
    cpx = layout(load_spec("mi300x-like"), "CPX/NPS4")
    assert (cpx.text, cpx.memory_mode, len(cpx.partitions)) == ("cpx/nps4", "nps4", 8)
    assert layout(load_spec("mi300x-like"), "cpx").memory_mode == "nps1"


def test_a_partition_has_its_share_of_the_chip_in_the_cost_model(h100):
    part = layout(h100, "3g.40gb").partitions[0].spec
    assert part.name == h100.name                               # same arch
    assert (part.compute_units, part.copy_engines) == (60, 3)
    assert part.hbm_bytes == pytest.approx(h100.hbm_bytes / 2, rel=1e-6)
    assert part.hbm_bandwidth == h100.hbm_bandwidth / 2 and part.l2_bytes == h100.l2_bytes // 2
    assert part.matrix_peak["bfloat16"] == pytest.approx(h100.matrix_peak["bfloat16"] * 60 / 132)
    assert [(e.kind, e.count) for e in part.media.engines] == [("nvdec", 3), ("nvjpg", 3)]
    stream = Counters(instances=4096, bytes_read=2**30, bytes_written=2**30)
    flops = Counters(instances=4096, matrix_flops={"bfloat16": 1e13})
    for work, ratio in ((stream, 2.0), (flops, 132 / 60)):
        whole, half = kernel_cost(h100, work).duration_s, kernel_cost(part, work).duration_s
        assert half / whole == pytest.approx(ratio, rel=0.05)


def _spec_file(tmp_path, table: str) -> Path:
    path = tmp_path / "chip.toml"
    path.write_text((SPECS / "tiny.toml").read_text() + "\n" + table)
    return path


GOOD = """
[partitions]
source = "invented"
[partitions.modes.halves]
choose = "mode"
label = "half"
description = "two halves"
instances = 2
peer = true
uncontained = "device"
faults = { page_fault = "partition", hang = "partition", ecc_uncorrectable = "device", link_failure = "device", device_lost = "device" }
[partitions.modes.halves.profiles.half]
compute_units = 2
memory = 0.5
copy_engines = 1
max_instances = 2
"""


@pytest.mark.parametrize("change,message", [
    (("compute_units = 2", "compute_units = 9"), "9 compute units, more than the chip's 4"),
    (("hang = \"partition\", ", ""), "must place every fault kind; missing hang"),
    (("peer = true", "peer = true\nwarp = 1"), "unknown key\\(s\\) warp"),
    (("uncontained = \"device\"", "uncontained = \"everywhere\""), "must be one of partition, device"),
    (("memory = 0.5", "memory = 1.5"), "fraction of the chip in \\(0, 1\\]"),
    (("compute_units = 2", "compute_units = 3"), "2 x half \\(3 units, memory 0.5\\) is more than the chip"),
])
def test_a_malformed_partitions_table_is_refused(tmp_path, change, message):
    assert load_spec(_spec_file(tmp_path, GOOD)).partitions.modes["halves"].instances == 2
    with pytest.raises(SpecError, match=message):
        load_spec(_spec_file(tmp_path, GOOD.replace(*change)))


MODE = {"choose": "mode", "label": "half", "description": "a half", "instances": 1, "peer": True,
        "uncontained": "device", "faults": dict.fromkeys(
            ("page_fault", "hang", "ecc_uncorrectable", "link_failure", "device_lost"), "device"),
        "profiles": {"half": {"compute_units": 2, "memory": 0.5, "copy_engines": 1, "max_instances": 1}}}


def test_a_partitions_table_that_is_not_tables_is_refused():
    chip = {"compute_units": 4, "copy_engines": 2, "media": None}
    for bad, message in (({"modes": 5}, "modes must be a table, got 5"),
                         ({"modes": {"a": {"choose": "mode", "profiles": 3}}}, "mode 'a' profiles must be a table"),
                         ({"modes": {}}, "declares no modes"),
                         ({"modes": {"a": dict(MODE, memory=[{}])}}, "memory must list memory modes")):
        with pytest.raises(SpecError, match=message):
            parse_partitions(bad, "chip.toml", chip)


def test_work_in_one_partition_never_sees_another_s_memory(h100):
    stack = compose(make_config("cuda-like", spec="h100-like", partition="1g.10gb:2"))
    drv = stack.driver
    assert drv.device_count() == 2 and not drv.can_access_peer(0, 1)     # MIG: no peer access
    a, b = drv.create_context(0), drv.create_context(1)
    ptr = drv.allocate(a, 4096, "managed")
    drv.host_write(a, ptr, np.arange(1024, dtype=np.float32))
    with pytest.raises(FornaxError, match="outside any allocation: this context has no live mappings"):
        drv.host_read(b, ptr, 4096)
    free, total = drv.memory_info(1)
    assert total == stack.devices[1].spec.hbm_bytes < h100.hbm_bytes / 7 and free == total
    with pytest.raises(FornaxError, match="out of device memory.*use a larger partition"):
        drv.allocate(a, total + 2**20)                    # more than the partition, less than the chip


def _chip(text: str, spec: str = "h100-like"):
    stack = compose(make_config("cuda-like", spec=spec, partition=text, meta=True))
    return stack.devices


@pytest.mark.parametrize("kind,contained,others_lost", [
    ("ecc_uncorrectable", True, False),     # MIG: a contained error stays in its GPU instance
    ("ecc_uncorrectable", False, True),     # an uncontained one needs a full GPU reset
    ("hang", True, False),
    ("device_lost", True, True),
])
def test_mig_fault_scopes(kind, contained, others_lost):
    devs = _chip("3g.40gb,4g.40gb")
    devs[0].inject(FaultPlan((FaultSpec(kind, at=1, contained=contained),)))
    with pytest.raises(Exception) as err:
        devs[0].begin("kernel", "k")
    assert err.value.kind == kind
    assert (devs[1].lost is not None) is others_lost
    if others_lost:
        assert devs[1].lost.kind == (kind if kind != "hang" else "device_lost")
        assert "whole chip must be reset" in str(devs[1].lost)
        assert devs[1].reset_group() == devs              # a reset of any partition resets all
        devs[1].reset()
        assert all(d.lost is None for d in devs) and devs[0].chip.resets == 1
    else:
        devs[1].begin("kernel", "k")                      # the neighbour keeps running


def test_each_family_places_an_uncorrectable_error_its_own_way():
    amd = _chip("cpx", "mi300x-like")                    # amdgpu resets the whole GPU
    amd[3].inject(FaultPlan((FaultSpec("ecc_uncorrectable", at=1),)))
    with pytest.raises(Exception):
        amd[3].begin("kernel", "k")
    assert all(d.lost is not None for d in amd)
    flat = _chip("flat", "max1550-like")                 # a hung stack is reset alone
    flat[1].inject(FaultPlan((FaultSpec("hang", at=1),)))
    with pytest.raises(Exception):
        flat[1].begin("kernel", "k")
    assert flat[0].lost is None and flat[1].reset_group() == [flat[1]]


def test_config_key_and_bad_input(tmp_path):
    cfg = tmp_path / "stack.toml"
    cfg.write_text('[stack]\nvendor = "rocm-like"\nspec = "mi300x-like"\npartition = "qpx/nps4"\n')
    loaded = load_config(cfg)
    assert loaded.partition == "qpx/nps4" and loaded.describe()["partition"] == "qpx/nps4"
    assert "partition" not in make_config("rocm-like").describe()
    assert make_config(base=loaded, partition="").partition is None      # the whole chip again
    cfg.write_text('[stack]\nvendor = "rocm-like"\npartition = 4\n')
    with pytest.raises(ConfigError, match="partition must be a string"):
        load_config(cfg)
    with pytest.raises(ConfigError, match="runs one rank per chip"):
        make_config("rocm-like", spec="mi300x-like", partition="cpx", parallel="dp")
    with pytest.raises(ConfigError, match="splits one chip into devices"):
        make_config("cuda-like", spec="h100-like", partition="3g.40gb", devices=2)
    with pytest.raises(ConfigError, match="valid profiles|it takes"):
        compose(make_config("cuda-like", spec="h100-like", partition="3g.45gb"))
