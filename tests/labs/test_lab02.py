"""Lab 2 (the hardware-software contract): wrong answers of each kind are caught with feedback
that says what was expected, and the live facts follow the chip specs -- a changed copy of a
spec changes them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fornax import labs
from fornax.labs import lab02
from fornax.labs.lab import Feedback
from fornax.sim.spec import load_spec

LAB = labs.get(2)


def _reference() -> str:
    return (LAB.reference_dir() / "answers.toml").read_text(encoding="utf-8")


def _check(folder: Path, text: str) -> dict[str, Feedback]:
    (folder / "answers.toml").write_text(text, encoding="utf-8")
    return {f.exercise: f for f in LAB.check(folder)}


def _clear() -> None:
    for fn in (lab02._rooflines, lab02._gemms, lab02._tiles, lab02._thermal, lab02._capacity):
        fn.cache_clear()


def test_the_reference_passes_and_hand_rounding_is_tolerated(tmp_path):
    got = _check(tmp_path, _reference())
    assert all(f.passed for f in got.values())
    # a ridge point worked out by hand to three figures, an alignment factor as 4/3 rounded
    got = _check(tmp_path, _reference().replace("= 206.04", "= 206").replace("= 1.3333", "= 1.33"))
    assert got["2.1"].passed and got["2.2"].passed


def test_wrong_answers_of_each_kind_are_caught(tmp_path):
    text = (_reference().replace("= 206.04", "= 295.2")        # the h100-like ridge, not h200's
            .replace("= 1.3333", "= 1.0")                      # as if the tile divided the instruction
            .replace('"memory"', '"compute"')
            .replace("= 73.0", "= 83.0")                       # the throttle point, not the steady state
            .replace("= 102", "= 101"))
    got = _check(tmp_path, text)
    assert not any(f.passed for f in got.values())
    assert "206.042" in got["2.1"].expected and "within 2%" in got["2.1"].expected and "295.2" in got["2.1"].observed
    assert "1.33333" in got["2.2"].expected and "1" == got["2.2"].observed
    assert got["2.3"].expected == "memory" and got["2.3"].observed == "compute"
    assert "72.9" in got["2.4"].expected and "83" in got["2.4"].observed
    assert got["2.5"].expected == "102" and got["2.5"].observed == "101"
    for f in got.values():
        assert f.text.startswith("expected ") and f.look_at in f.text
    # a number given as text, and a blank
    got = _check(tmp_path, _reference().replace("= 102", '= "102"').replace('ex2_1 = 206.04', 'ex2_1 = ""'))
    assert not got["2.5"].passed and got["2.5"].observed == "'102'"
    assert not got["2.1"].passed and got["2.1"].observed == "(blank)"


def test_the_ridge_and_alignment_follow_the_spec(tmp_path):
    h200 = load_spec("h200-like")
    assert lab02.roofline(h200)["ridge"] == pytest.approx(989e12 / 4.8e12)
    # a copy of the spec file with twice the bandwidth and a 16-wide instruction
    text = (Path(lab02.__file__).parents[1] / "sim" / "specs" / "mi300x-like.toml").read_text(encoding="utf-8")
    text = text.replace("matrix_shape = [32, 32, 8]", "matrix_shape = [16, 16, 8]")
    text = text.replace("hbm_bandwidth = 5.3e12", "hbm_bandwidth = 10.6e12")
    copy = tmp_path / "mi300x-copy.toml"
    copy.write_text(text, encoding="utf-8")
    spec, changed = load_spec("mi300x-like"), load_spec(copy)
    assert lab02.roofline(changed)["ridge"] == pytest.approx(lab02.roofline(spec)["ridge"] / 2)
    assert lab02.tile_alignment(spec, lab02.ODD_TILE)[0] == pytest.approx(4 / 3)
    assert lab02.tile_alignment(changed, lab02.ODD_TILE)[0] == pytest.approx(1.0)
    assert lab02.tile_alignment(changed, lab02.ODD_TILE)[1] < lab02.tile_alignment(spec, lab02.ODD_TILE)[1]


def test_throttling_and_capacity_follow_the_spec():
    h100 = load_spec("h100-like")
    cool = lab02.sustained(h100, h100.power["ambient_c"], seconds=40.0)
    hot = lab02.sustained(h100, lab02.HOT_INLET_C, seconds=40.0)
    assert cool["first_throttle_s"] < 0 and cool["clock"] == 1.0
    assert hot["first_throttle_s"] > 0 and hot["clock"] < 1.0 and hot["gemms"] < cool["gemms"]
    assert hot["peak_c"] == pytest.approx(h100.power["throttle_temp_c"], abs=0.5)
    assert cool["steady_c"] == pytest.approx(h100.power["ambient_c"]
                                             + h100.power["thermal_resistance_c_per_w"] * cool["power_w"])
    # only hbm_bytes differs: an h100-like with the h200-like's HBM holds what the h200-like holds
    bigger = dataclasses.replace(h100, hbm_bytes=load_spec("h200-like").hbm_bytes)
    assert lab02.kv_capacity(bigger).max_sequences == lab02.kv_capacity(load_spec("h200-like")).max_sequences
    assert lab02.kv_capacity(bigger).max_sequences > lab02.kv_capacity(h100).max_sequences


def test_the_checks_compare_against_the_live_specs(tmp_path, monkeypatch):
    """Swap in a spec whose bandwidth differs: the reference ridge answer no longer passes, and
    the feedback names the new value."""
    real = lab02._spec

    def spec(chip: str):
        s = real(chip)
        return dataclasses.replace(s, hbm_bandwidth=s.hbm_bandwidth * 2) if chip == "h200-like" else s

    _clear()
    monkeypatch.setattr(lab02, "_spec", spec)
    try:
        got = _check(tmp_path, _reference())
        assert not got["2.1"].passed and "103.021" in got["2.1"].expected
        assert got["2.2"].passed and got["2.3"].passed
    finally:
        monkeypatch.undo()
        _clear()
