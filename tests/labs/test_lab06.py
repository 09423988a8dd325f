"""Lab 6's checks catch wrong answers of each kind: a wrong number, and a fusion.py that is
missing, malformed, raises, builds a graph that does not fuse, or fuses with wrong numerics --
each a failing verdict that says what was observed and points at the fusion pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from fornax import labs

LAB = labs.get(6)
FUSE = "fornax/layers/passes/fuse.py"


def _verdicts(folder: Path) -> dict:
    return {v.exercise: v for v in LAB.check(folder)}


@pytest.fixture
def folder(tmp_path):
    ref = LAB.reference_dir()
    (tmp_path / "answers.toml").write_text((ref / "answers.toml").read_text(encoding="utf-8"))
    (tmp_path / "fusion.py").write_text((ref / "fusion.py").read_text(encoding="utf-8"))
    return tmp_path


def _fusion(folder: Path, body: str) -> None:
    (folder / "fusion.py").write_text("import numpy as np\nfrom fornax.layers.graph import DType, Graph\n\n"
                                      + body)


def test_a_wrong_number_is_caught(folder):
    text = (folder / "answers.toml").read_text().replace("ex6_1 = 3", "ex6_1 = 4").replace("ex6_3 = 2", 'ex6_3 = "2"')
    (folder / "answers.toml").write_text(text)
    got = _verdicts(folder)
    assert not got["6.1"].passed and got["6.1"].expected == "3" and got["6.1"].observed == "4"
    assert FUSE in got["6.1"].look_at
    assert not got["6.3"].passed                          # a number given as text
    assert got["6.2"].passed and got["6.4"].passed


def test_a_graph_that_does_not_fuse_fails_and_says_what_was_seen(folder):
    _fusion(folder, "def build():\n    g = Graph('one')\n    x = g.input('x', (8, 8), DType.FLOAT32)\n"
                    "    g.output(g.op('relu', x), names=['y'])\n"
                    "    return g, {'x': np.ones((8, 8), np.float32)}\n")
    v = _verdicts(folder)["6.4"]
    assert not v.passed and "1 kernels, 0 fused" in v.observed and "nothing fused" in v.observed
    assert FUSE in v.text


def test_a_fusion_py_that_raises_or_is_malformed_fails_cleanly(folder):
    _fusion(folder, "def build():\n    raise ValueError('not yet')\n")
    v = _verdicts(folder)["6.4"]
    assert not v.passed and "ValueError: not yet" in v.observed
    (folder / "fusion.py").write_text("def build(:\n")
    v = _verdicts(folder)["6.4"]
    assert not v.passed and "SyntaxError" in v.observed
    (folder / "fusion.py").write_text("BUILD = 1\n")
    assert _verdicts(folder)["6.4"].observed == "fusion.py defines no build()"
    _fusion(folder, "def build():\n    return 42\n")
    assert "not (Graph, feeds dict)" in _verdicts(folder)["6.4"].observed
    _fusion(folder, "def build():\n    g = Graph('g')\n    x = g.input('x', (4,), DType.FLOAT32)\n"
                    "    g.output(g.op('relu', g.op('neg', x)), names=['y'])\n    return g, {}\n")
    v = _verdicts(folder)["6.4"]
    assert not v.passed and "did not run on rocm-like" in v.observed
    (folder / "fusion.py").unlink()
    assert _verdicts(folder)["6.4"].observed == "no fusion.py"


def test_a_fused_graph_with_wrong_numerics_fails(folder):
    # float16 overflows on the device (300 * 300 > 65504); the float64 reference does not
    _fusion(folder, "def build():\n    g = Graph('big')\n    x = g.input('x', (8, 8), DType.FLOAT16)\n"
                    "    g.output(g.op('relu', g.op('mul', x, x)), names=['y'])\n"
                    "    return g, {'x': np.full((8, 8), 300, np.float16)}\n")
    v = _verdicts(folder)["6.4"]
    assert not v.passed and "1 fused" in v.observed and "is off" in v.observed


def test_the_family_must_be_named(folder):
    text = (folder / "answers.toml").read_text().replace('"rocm-like"', '""')
    (folder / "answers.toml").write_text(text)
    v = _verdicts(folder)["6.4"]
    assert not v.passed and "name the family" in v.observed
