"""Chip specs (loading, validation) and the roofline cost model."""

import tomllib
from importlib import resources

import pytest

from fornax.sim.cost import copy_cost, kernel_cost, wave_efficiency
from fornax.sim.execute import Counters
from fornax.sim.faults import SpecError
from fornax.sim.spec import ChipSpec, _FIELDS, available_specs, load_spec


def tiny_text() -> str:
    return (resources.files("fornax.sim") / "specs" / "tiny.toml").read_text()


def write_spec(tmp_path, data: dict) -> str:
    lines, tables = [], []
    for k, v in data.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {_toml(v)}")
    for k, v in tables:
        lines.append(f"[{k}]")
        lines.extend(f"{kk} = {_toml(vv)}" for kk, vv in v.items())
    path = tmp_path / "chip.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _toml(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):                  # a nested table ([media]) as an inline table
        return "{" + ", ".join(f'"{k}" = {_toml(x)}' for k, x in v.items()) + "}"
    return repr(v)


@pytest.fixture
def tiny_data():
    return tomllib.loads(tiny_text())


def test_shipped_specs_load():
    names = available_specs()
    assert "tiny" in names and len(names) >= 2
    for name in names:
        spec = load_spec(name)
        assert isinstance(spec, ChipSpec)
        assert spec.name == name
        assert spec.source                                  # every spec cites its figures
        assert spec.compute_units > 0 and spec.hbm_bytes > 0
        assert spec.page_size & (spec.page_size - 1) == 0
        assert len(spec.matrix_shape) == 3 and len(spec.max_grid) == 3
        assert "float32" in spec.vector_peak


def test_tiny_figures():
    spec = load_spec("tiny")
    assert spec.compute_units == 4
    assert spec.hbm_bytes == 64 * 1024 * 1024
    assert spec.matrix_shape == (16, 8, 16)
    assert spec.peak("bfloat16", matrix=True) == 16.0e12
    assert spec.peak("bfloat16", matrix=False) == 2.0e12
    assert spec.peak("int8", matrix=True) == 1.0e12          # falls back to fp32 vector


def test_roundtrip_through_a_file(tmp_path, tiny_data):
    assert load_spec(write_spec(tmp_path, tiny_data)) == load_spec("tiny")
    from pathlib import Path
    assert load_spec(Path(write_spec(tmp_path, tiny_data))).name == "tiny"


@pytest.mark.parametrize("missing", ["compute_units", "hbm_bandwidth", "matrix_peak", "page_size"])
def test_missing_field_is_named(tmp_path, tiny_data, missing):
    del tiny_data[missing]
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(tmp_path, tiny_data))
    assert f"missing field(s) {missing}" in str(info.value)


def test_every_field_is_required(tmp_path, tiny_data):
    for key in _FIELDS:
        data = dict(tiny_data)
        del data[key]
        with pytest.raises(SpecError, match=key):
            load_spec(write_spec(tmp_path, data))


@pytest.mark.parametrize("key, value, fragment", [
    ("compute_units", "four", "must be int"),
    ("compute_units", 4.5, "must be int"),
    ("compute_units", True, "must be int"),
    ("clock_ghz", "fast", "must be float"),
    ("max_grid", 7, "must be list"),
    ("compute_units", 0, "must be positive"),
    ("hbm_bandwidth", -1.0, "must be positive"),
    ("launch_latency_s", 0, "must be positive"),
    ("matrix_shape", [16, 8], "three positive integers"),
    ("max_grid", [1, 0, 1], "three positive integers"),
    ("matrix_efficiency", 1.5, "fraction"),
    ("page_size", 3000, "power of two"),
])
def test_bad_values_rejected(tmp_path, tiny_data, key, value, fragment):
    tiny_data[key] = value
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(tmp_path, tiny_data))
    assert key in str(info.value) and fragment in str(info.value)


def test_bad_peak_tables(tmp_path, tiny_data):
    tiny_data["matrix_peak"] = {"float32": 0}
    with pytest.raises(SpecError, match="matrix_peak.float32"):
        load_spec(write_spec(tmp_path, tiny_data))
    tiny_data["matrix_peak"] = {"float32": 1.0}
    tiny_data["vector_peak"] = {"float16": 1.0}
    with pytest.raises(SpecError, match="vector_peak must define float32"):
        load_spec(write_spec(tmp_path, tiny_data))


def test_unknown_field_rejected(tmp_path, tiny_data):
    tiny_data["warp_drive"] = 1
    with pytest.raises(SpecError, match="warp_drive"):
        load_spec(write_spec(tmp_path, tiny_data))


def test_unknown_name_lists_shipped_specs():
    with pytest.raises(SpecError) as info:
        load_spec("no-such-chip")
    msg = str(info.value)
    assert "no-such-chip" in msg
    for name in available_specs():
        assert name in msg


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(str(tmp_path / "nope.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed\n")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(str(bad))


# ---- cost model ----------------------------------------------------------------------
@pytest.fixture
def spec():
    return load_spec("tiny")


def body(cost):
    return cost.duration_s - cost.launch_s


def test_memory_bound_time_is_linear_in_bytes(spec):
    bw = spec.hbm_bandwidth * spec.memory_efficiency
    costs = []
    for nbytes in (1e8, 2e8, 4e8):
        c = Counters(instances=1024, bytes_read=int(nbytes) // 2, bytes_written=int(nbytes) // 2,
                     vector_flops={"float32": 1e3})
        costs.append(kernel_cost(spec, c))
    assert all(c.bound == "memory" for c in costs)
    assert body(costs[1]) == pytest.approx(2 * body(costs[0]))
    assert body(costs[2]) == pytest.approx(4 * body(costs[0]))
    assert body(costs[0]) == pytest.approx(1e8 / bw)


def test_compute_bound_time_is_linear_in_flops(spec):
    rate = spec.matrix_peak["float16"] * spec.matrix_efficiency
    costs = [kernel_cost(spec, Counters(instances=1024, matrix_flops={"float16": f}, bytes_read=64))
             for f in (1e12, 2e12, 3e12)]
    assert all(c.bound == "compute" for c in costs)
    assert body(costs[0]) == pytest.approx(1e12 / rate)
    assert body(costs[1]) == pytest.approx(2 * body(costs[0]))
    assert body(costs[2]) == pytest.approx(3 * body(costs[0]))
    # a dtype with a lower peak takes longer for the same work
    fp32 = kernel_cost(spec, Counters(instances=1024, matrix_flops={"float32": 1e12}))
    assert body(fp32) == pytest.approx(4 * body(costs[0]))
    vec = kernel_cost(spec, Counters(instances=1024, vector_flops={"float32": 1e12}))
    assert body(vec) == pytest.approx(1e12 / spec.vector_peak["float32"])


def test_wave_quantisation(spec):
    units = spec.compute_units
    per_instance = 1e9

    def per_inst(n):
        c = Counters(instances=n, matrix_flops={"float32": per_instance * n})
        return body(kernel_cost(spec, c)) / n

    assert per_inst(units + 1) > per_inst(units) * 1.5
    assert per_inst(2 * units) == pytest.approx(per_inst(units))
    assert wave_efficiency(units, units) == 1.0
    assert wave_efficiency(units + 1, units) == pytest.approx((units + 1) / (2 * units))
    assert wave_efficiency(0, units) == 1.0
    assert kernel_cost(spec, Counters(instances=units + 1)).wave_efficiency == \
        pytest.approx((units + 1) / (2 * units))


def test_small_grid_leaves_units_idle(spec):
    flops = 1e12
    one = kernel_cost(spec, Counters(instances=1, matrix_flops={"float32": flops}))
    full = kernel_cost(spec, Counters(instances=spec.compute_units, matrix_flops={"float32": flops}))
    assert body(one) == pytest.approx(spec.compute_units * body(full))


def test_launch_latency_floor(spec):
    empty = kernel_cost(spec, Counters())
    assert empty.duration_s == spec.launch_latency_s and empty.bound == "latency"
    tiny = kernel_cost(spec, Counters(instances=1, bytes_read=64, vector_flops={"float32": 32}))
    assert tiny.bound == "latency"
    assert spec.launch_latency_s <= tiny.duration_s < 1.01 * spec.launch_latency_s
    big = kernel_cost(spec, Counters(instances=8, bytes_read=10**9))
    assert big.duration_s > spec.launch_latency_s


def test_copy_cost(spec):
    n = 10**8
    assert copy_cost(spec, n, "h2d") == pytest.approx(spec.copy_latency_s + n / spec.host_link_bandwidth)
    assert copy_cost(spec, n, "d2h") == copy_cost(spec, n, "h2d")
    assert copy_cost(spec, n, "d2d") == pytest.approx(
        spec.copy_latency_s + 2 * n / (spec.hbm_bandwidth * spec.memory_efficiency))
    assert copy_cost(spec, 0, "h2d") == spec.copy_latency_s
    with pytest.raises(ValueError):
        copy_cost(spec, n, "sideways")
