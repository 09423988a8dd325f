"""Lab 4 catches wrong answers of each kind: wrong values, a number given as text, and each way
lowering.py can be wrong (the blank starter, an op that does not fall back, a rule that raises,
one with the wrong values, one that does not import, one without OP or lower, none at all);
the reference rule takes copysign to the device, and no check leaks a rule into the lowering
table or leaves its session active."""

from __future__ import annotations

import shutil

import pytest

from fornax import labs
from fornax.frameworks.torch import session as sess
from fornax.frameworks.torch.lowering.table import TABLE

LAB = labs.get(4)
OP = "aten::copysign.Tensor"


def _folder(tmp_path, lowering: str | None):
    ref = LAB.reference_dir()
    shutil.copy(ref / "answers.toml", tmp_path / "answers.toml")
    if lowering is not None:
        (tmp_path / "lowering.py").write_text(lowering)
    return tmp_path


@pytest.fixture(autouse=True)
def _nothing_leaks():
    table, current = dict(TABLE), sess._current
    yield
    assert TABLE == table and OP not in TABLE
    assert sess._current is current


def _verdicts(folder):
    return {v.exercise: v for v in LAB.check(folder)}


def test_wrong_values_are_caught(tmp_path):
    folder = _folder(tmp_path, (LAB.reference_dir() / "lowering.py").read_text())
    text = (folder / "answers.toml").read_text()
    text = (text.replace('"x[1:3]"', '"x.t()"').replace("= 1", "= 2").replace('"decomposed"', '"native"')
            .replace('"aten::copysign.Tensor"', '"aten::trace"'))
    (folder / "answers.toml").write_text(text)
    got = _verdicts(folder)
    assert not got["4.1"].passed and got["4.1"].expected == "x[1:3]" and got["4.1"].observed == "x.t()"
    assert not got["4.2"].passed and got["4.2"].expected == "1" and got["4.2"].observed == "2"
    assert not got["4.3"].passed and got["4.3"].expected == "decomposed"
    assert not got["4.4"].passed and got["4.4"].expected == OP
    assert got["4.5"].passed and "route native" in got["4.5"].observed
    (folder / "answers.toml").write_text(text.replace("= 2", '= "1"'))
    assert not _verdicts(folder)["4.2"].passed          # a number given as text


def test_the_blank_starter_and_an_op_that_does_not_fall_back_are_caught(tmp_path):
    folder = _folder(tmp_path, LAB.starter()["lowering.py"])
    v = _verdicts(folder)["4.5"]
    assert not v.passed and v.points == 0 and "OP = ''" in v.observed and OP in v.expected
    assert "lowering/table.py" in v.text
    (folder / "lowering.py").write_text('OP = "aten::trace"\n\ndef lower(ctx, self):\n    return self\n')
    v = _verdicts(folder)["4.5"]
    assert not v.passed and "'aten::trace', which is not an op the probe sees falling back" in v.observed


def test_a_rule_that_raises_or_computes_wrong_values_is_caught(tmp_path):
    raising = f'OP = "{OP}"\n\ndef lower(ctx, self, other):\n    raise ValueError("not yet")\n'
    folder = _folder(tmp_path, raising)
    v = _verdicts(folder)["4.5"]
    assert not v.passed and "still takes route fallback" in v.observed and "ValueError: not yet" in v.observed
    # |self| only: on the device, but the sign of other is lost
    (folder / "lowering.py").write_text(f'OP = "{OP}"\n\ndef lower(ctx, self, other):\n'
                                        '    return ctx.op("abs", self)\n')
    v = _verdicts(folder)["4.5"]
    assert not v.passed and "runs on the device now, but its values differ from the CPU's" in v.observed
    # registering with the decorator at import time is undone too (the fixture checks TABLE)
    (folder / "lowering.py").write_text(
        f'from fornax.frameworks.torch.lowering.table import lowering\nOP = "{OP}"\n\n'
        f'@lowering(OP)\ndef lower(ctx, self, other):\n    return ctx.op("neg", self)\n')
    v = _verdicts(folder)["4.5"]
    assert not v.passed and "values differ" in v.observed


def test_a_broken_or_missing_lowering_py_is_caught(tmp_path):
    folder = _folder(tmp_path, "def lower(:\n")
    v = _verdicts(folder)["4.5"]
    assert not v.passed and "does not import: SyntaxError" in v.observed
    (folder / "lowering.py").write_text(f'OP = "{OP}"\n')
    v = _verdicts(folder)["4.5"]
    assert not v.passed and "defines no function lower" in v.observed
    (folder / "lowering.py").write_text("def lower(ctx, self, other):\n    return self\n")
    v = _verdicts(folder)["4.5"]
    assert not v.passed and "defines no OP" in v.observed
    (folder / "lowering.py").unlink()
    v = _verdicts(folder)["4.5"]
    assert not v.passed and v.observed == "no lowering.py"


def test_the_starter_has_a_marked_fix_and_no_answer():
    text = LAB.starter()["lowering.py"]
    assert "# FIX HERE" in text and 'OP = ""' in text and "copysign" not in text
