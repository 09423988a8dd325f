"""Lab 1 catches wrong answers of each kind: wrong levels, a number given as text, and for the
stack.toml exercise a stack whose level passes, a named row that is not the one that fails, a
row that is no L0/L1 evidence, a missing or malformed stack.toml; the reference stack fails L0
live, caught by L0.torch."""

from __future__ import annotations

from fornax import labs

LAB = labs.get(1)


def _folder(tmp_path, stack: str | None, **answers: object):
    ref = LAB.reference_dir()
    text = (ref / "answers.toml").read_text()
    for key, value in answers.items():
        lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key} =")]
        text = "\n".join(lines) + f"\n{key} = {value}\n"
    (tmp_path / "answers.toml").write_text(text)
    if stack is not None:
        (tmp_path / "stack.toml").write_text(stack)
    return tmp_path


def _verdicts(folder):
    return {v.exercise: v for v in LAB.check(folder)}


def _ref_stack() -> str:
    return (LAB.reference_dir() / "stack.toml").read_text()


def test_wrong_values_are_caught(tmp_path):
    folder = _folder(tmp_path, _ref_stack(), ex1_1='"L6"', ex1_2='"L4"', ex1_3=10)
    got = _verdicts(folder)
    assert not got["1.1"].passed and got["1.1"].expected == "L7" and got["1.1"].observed == "L6"
    assert not got["1.2"].passed and got["1.2"].expected == "L5"
    assert not got["1.3"].passed and got["1.3"].expected == "11" and got["1.3"].observed == "10"
    assert got["1.4"].passed and "L0 fails on framework=cuda-like" in got["1.4"].observed
    assert "L0.torch" in got["1.4"].observed and "0x" not in got["1.4"].observed
    folder = _folder(tmp_path, None, ex1_3='"11"')
    assert not _verdicts(folder)["1.3"].passed          # a number given as text


def test_a_stack_that_passes_the_level_is_caught(tmp_path):
    folder = _folder(tmp_path, '[stack]\nvendor = "rocm-like"\n')
    v = _verdicts(folder)["1.4"]
    assert not v.passed and v.points == 0
    assert v.observed.startswith("L0 passes on rocm-like on h200-like") and "L0.torch" in v.observed
    assert "l0_device.py" in v.look_at and "l0_device.py" in v.text


def test_the_wrong_row_and_rows_that_are_not_evidence_are_caught(tmp_path):
    folder = _folder(tmp_path, _ref_stack(), ex1_4='"L0.driver"')
    v = _verdicts(folder)["1.4"]
    assert not v.passed and "but L0.driver passed" in v.observed and "failing rows: L0.torch" in v.observed
    for bad, said in (('"L5.autocast"', "not an evidence row of L0 or L1"),
                      ('"torch"', "not an evidence row of L0 or L1"), ('""', "ex1_4 is blank"),
                      ("0", "not an evidence row of L0 or L1")):
        v = _verdicts(_folder(tmp_path, _ref_stack(), ex1_4=bad))["1.4"]
        assert not v.passed and said in v.observed, (bad, v.observed)


def test_missing_and_malformed_stack_toml_are_caught(tmp_path):
    folder = _folder(tmp_path, None)
    v = _verdicts(folder)["1.4"]
    assert not v.passed and v.observed == "no stack.toml"
    for text in ("[stack\n", '[stack]\nvendor = "cuda-lik"\n', '[stack]\ncolour = 1\n',
                 '[stack]\nvendor = "rocm-like"\nmeta = true\n'):
        (folder / "stack.toml").write_text(text)
        v = _verdicts(folder)["1.4"]
        assert not v.passed and v.observed and v.expected, text


def test_the_starter_stack_toml_is_only_a_comment():
    assert LAB.starter()["stack.toml"].startswith("#")
