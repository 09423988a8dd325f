"""Lab 7 catches wrong answers of each kind: wrong values, a number given as text, and each way
policy.py can be wrong (the float32 starter, everything in bfloat16, a residual in bfloat16, an
unknown dtype, a missing op, not a dict, one that raises, none at all); the reference policy.py
passes on every family."""

from __future__ import annotations

import shutil

from fornax import labs

LAB = labs.get(7)


def _folder(tmp_path, policy: str | None):
    ref = LAB.reference_dir()
    shutil.copy(ref / "answers.toml", tmp_path / "answers.toml")
    if policy is not None:
        (tmp_path / "policy.py").write_text(policy)
    return tmp_path


def _verdicts(folder):
    return {v.exercise: v for v in LAB.check(folder)}


def _policy(**dtypes: str) -> str:
    base = dict.fromkeys(("fc1", "act", "fc2", "residual", "loss"), "float32")
    return f"POLICY = {({**base, **dtypes})!r}\n"


def test_wrong_values_are_caught(tmp_path):
    folder = _folder(tmp_path, (LAB.reference_dir() / "policy.py").read_text())
    text = (folder / "answers.toml").read_text()
    bad = text.replace('"fp32"', '"lower_precision_fp"').replace('"float32"', '"bfloat16"').replace("0.23398", "0.2")
    (folder / "answers.toml").write_text(bad)
    got = _verdicts(folder)
    assert not got["7.1"].passed and got["7.1"].expected == "fp32"
    assert not got["7.2"].passed and got["7.2"].expected == "float32"
    assert not got["7.3"].passed and got["7.3"].observed == "0.2"
    assert got["7.4"].passed and "matmuls in bfloat16" in got["7.4"].observed
    (folder / "answers.toml").write_text(text.replace("0.23398", '"0.23398"'))
    assert not _verdicts(folder)["7.3"].passed          # a number given as text


def test_the_float32_starter_is_caught_naming_the_dtype_it_ran_in(tmp_path):
    folder = _folder(tmp_path, LAB.starter()["policy.py"])
    v = _verdicts(folder)["7.4"]
    assert not v.passed and v.points == 0
    assert "cuda-like: fc1, fc2 ran in float32" in v.observed and "look at" in v.text


def test_a_lossy_policy_is_caught_with_the_observed_error(tmp_path):
    for pol in (_policy(**dict.fromkeys(("fc1", "act", "fc2", "residual", "loss"), "bfloat16")),
                _policy(fc1="bfloat16", fc2="bfloat16", residual="bfloat16")):
        folder = _folder(tmp_path, pol)
        v = _verdicts(folder)["7.4"]
        assert not v.passed and "relative error" in v.observed and "residual bfloat16" in v.observed


def test_malformed_raising_and_missing_policy_are_caught(tmp_path):
    folder = _folder(tmp_path, _policy(fc1="bfloat16", fc2="bf16"))
    v = _verdicts(folder)["7.4"]
    assert not v.passed and "POLICY['fc2'] is 'bf16'" in v.observed
    (folder / "policy.py").write_text("POLICY = {'fc1': 'bfloat16'}\n")
    assert "names no dtype for act" in _verdicts(folder)["7.4"].observed
    (folder / "policy.py").write_text("POLICY = ['bfloat16']\n")
    assert "not a dict" in _verdicts(folder)["7.4"].observed
    (folder / "policy.py").write_text("raise RuntimeError('boom')\n")
    assert "does not import: RuntimeError: boom" in _verdicts(folder)["7.4"].observed
    (folder / "policy.py").write_text("x = 1\n")
    assert "defines no POLICY" in _verdicts(folder)["7.4"].observed
    (folder / "policy.py").unlink()
    assert _verdicts(folder)["7.4"].observed == "no policy.py"
