"""Lab 10's checks catch wrong answers of each kind: a wrong metric, a wrong count, a
tolerance off by more than 2%, a wrong level, and a matrix.toml that is malformed, too big,
missing, or whose rerun with fusion off does not regress peak device memory."""

from __future__ import annotations

import shutil

import pytest

from fornax import labs


@pytest.fixture
def folder(tmp_path):
    ref = labs.get(10).reference_dir()
    for name in ("answers.toml", "matrix.toml"):
        shutil.copy(ref / name, tmp_path / name)
    return tmp_path


def _check(folder):
    return {v.exercise: v for v in labs.get(10).check(folder)}


def test_wrong_values_are_caught(folder):
    text = (folder / "answers.toml").read_text()
    text = (text.replace("= 5", "= 2").replace('"peak_device_bytes"', '"kernels"')
            .replace("= 0.133", "= 0.001").replace('"L2"', '"L7"'))
    (folder / "answers.toml").write_text(text)
    got = _check(folder)
    assert not got["10.1"].passed and got["10.1"].expected == "5" and got["10.1"].observed == "2"
    assert not got["10.2"].passed and got["10.2"].expected == "peak_device_bytes"
    assert not got["10.3"].passed and "within 2%" in got["10.3"].expected
    assert not got["10.4"].passed and got["10.4"].expected == "L2"
    assert got["10.5"].passed
    # a tolerance given as text is not a number
    (folder / "answers.toml").write_text(text.replace("= 0.001", '= "0.133"'))
    assert not _check(folder)["10.3"].passed


def test_a_matrix_that_misses_the_regression_fails_with_what_was_observed(folder):
    # mlp alone: fusion off regresses kernels and time, never peak device memory
    (folder / "matrix.toml").write_text('[matrix]\nvendors = ["xpu-like"]\nframeworks = ["graph"]\n'
                                        'workloads = ["mlp"]\nspecs = ["h200-like"]\n')
    v = _check(folder)["10.5"]
    assert not v.passed and "not peak_device_bytes" in v.observed and "kernels" in v.observed
    assert "plan.py" in v.look_at
    # softmax with a tolerance that lets peak memory double: not caught either
    (folder / "matrix.toml").write_text('[matrix]\nvendors = ["cuda-like"]\nframeworks = ["graph"]\n'
                                        'workloads = ["softmax"]\nspecs = ["h200-like"]\n'
                                        '[tolerances]\npeak_device_bytes = { relative = 1.0 }\n')
    v = _check(folder)["10.5"]
    assert not v.passed and "not peak_device_bytes" in v.observed
    # a baseline saved unfused: the unfused rerun changes nothing
    (folder / "matrix.toml").write_text('[matrix]\nvendors = ["cuda-like"]\nframeworks = ["graph"]\n'
                                        'workloads = ["softmax"]\nspecs = ["h200-like"]\n[stack]\nfuse = false\n')
    v = _check(folder)["10.5"]
    assert not v.passed and "fuse = false" in v.observed and "regressed none" in v.observed


def test_a_malformed_big_or_missing_matrix_fails(folder):
    (folder / "matrix.toml").write_text("[matrix\n")
    v = _check(folder)["10.5"]
    assert not v.passed and v.expected == "a valid answer" and "matrix file" in v.observed
    (folder / "matrix.toml").write_text('[matrix]\nvendors = ["cuda-like"]\nframeworks = ["graph"]\n'
                                        'workloads = ["softmax"]\nspecs = ["h200-like"]\n[stack]\nfuse = "yes"\n')
    v = _check(folder)["10.5"]
    assert not v.passed and "fuse must be true or false" in v.observed
    (folder / "matrix.toml").write_text('[matrix]\nvendors = ["cuda-like", "rocm-like", "xpu-like"]\n'
                                        'frameworks = ["graph"]\nworkloads = ["mlp", "softmax", "mlp-softmax"]\n'
                                        'specs = ["h200-like"]\n')
    v = _check(folder)["10.5"]
    assert not v.passed and v.observed == "9 runs"
    (folder / "matrix.toml").unlink()
    v = _check(folder)["10.5"]
    assert not v.passed and v.observed == "no matrix.toml"
