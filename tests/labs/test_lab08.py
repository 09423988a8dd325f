"""Lab 8 catches wrong answers of each kind: wrong values, a number given as text, and each way
the stack.toml answer can be wrong (missing, malformed, wrong device count, another chip, an
unknown fabric, no or a bad algorithm, slower than the baseline); the reference beats the
baseline live."""

from __future__ import annotations

import shutil

from fornax import labs

LAB = labs.get(8)


def _folder(tmp_path, stack: str | None = None, algorithm: str | None = None):
    ref = LAB.reference_dir()
    text = (ref / "answers.toml").read_text()
    if algorithm is not None:
        text = text.replace('ex8_5 = "ring"', f"ex8_5 = {algorithm}")
    (tmp_path / "answers.toml").write_text(text)
    if stack is None:
        shutil.copy(ref / "stack.toml", tmp_path / "stack.toml")
    elif stack != "":
        (tmp_path / "stack.toml").write_text(stack)
    return tmp_path


def _verdicts(folder):
    return {v.exercise: v for v in LAB.check(folder)}


def test_wrong_values_are_caught(tmp_path):
    folder = _folder(tmp_path)
    text = (folder / "answers.toml").read_text()
    text = (text.replace('"tree"', '"ring"').replace("157.6", "105.1")
            .replace('"ncclAllGather"', '"ncclAllReduce"').replace('"ncclUnhandledCudaError"', '"ncclSystemError"'))
    (folder / "answers.toml").write_text(text)
    got = _verdicts(folder)
    assert not got["8.1"].passed and got["8.1"].expected == "tree"
    assert not got["8.2"].passed and got["8.2"].observed == "105.1"
    assert not got["8.3"].passed and got["8.3"].expected == "ncclAllGather"
    assert not got["8.4"].passed and got["8.4"].expected == "ncclUnhandledCudaError"
    assert got["8.5"].passed
    (folder / "answers.toml").write_text(text.replace("105.1", '"157.6"'))
    v = _verdicts(folder)["8.2"]
    assert not v.passed and v.observed == "'157.6'"          # a number given as text


def _code(tmp_path, stack=None, algorithm=None):
    v = _verdicts(_folder(tmp_path, stack, algorithm))["8.5"]
    assert v.points in (0, 2) and "topology.py" in v.look_at
    return v


def test_slower_than_the_baseline_is_caught_with_the_observed_time(tmp_path):
    v = _code(tmp_path, '[stack]\nvendor = "cuda-like"\ndevices = 4\ntopology = "ring"\n', '"tree"')
    assert not v.passed and "79.81 µs" in v.observed and "78.8 GB/s" in v.observed
    assert "less than the baseline" in v.expected
    # the mesh with the tree algorithm is slower still
    v = _code(tmp_path, '[stack]\nvendor = "rocm-like"\ndevices = 4\ntopology = "mesh"\n', '"tree"')
    assert not v.passed and "131.73 µs" in v.observed


def test_a_faster_choice_on_eight_devices_passes(tmp_path):
    v = _code(tmp_path, '[stack]\nvendor = "xpu-like"\ndevices = 8\ntopology = "switch"\n', '"auto"')
    assert v.passed and "8 devices, switch fabric, auto (ring ran)" in v.observed


def test_each_malformed_stack_toml_is_caught(tmp_path):
    cases = {
        "": "no stack.toml",
        "[stack\n": "not valid TOML",
        '[stack]\nvendor = "rocm-like"\ndevices = 2\ntopology = "switch"\n': "devices = 2",
        '[stack]\nvendor = "rocm-like"\ndevices = 4\ntopology = "switch"\nspec = "mi300x-like"\n': "spec = 'mi300x-like'",
        '[stack]\nvendor = "rocm-like"\ndevices = 4\ntopology = "torus"\n': "unknown topology 'torus'",
        '[stack]\nvendor = "rocm-like"\ndevices = 4\nalgorithm = "ring"\n': "unknown key",
        '[stack]\nvendor = "rocm-like"\ndevices = 4\nmeta = true\n': "meta = true",
        "# nothing yet\n": "no [stack] table",
        '[stack]\ndevices = 4\n': "no vendor",
    }
    for i, (stack, said) in enumerate(cases.items()):
        sub = tmp_path / str(i)
        sub.mkdir()
        v = _code(sub, stack)
        assert not v.passed and said in v.observed, (stack, v.observed)


def test_a_missing_or_bad_algorithm_is_caught(tmp_path):
    for i, algo in enumerate(['""', '"double_tree"', "1"]):
        sub = tmp_path / str(i)
        sub.mkdir()
        v = _code(sub, None, algo)
        assert not v.passed and "ex8_5" in v.observed and "ring, tree, auto" in v.expected
