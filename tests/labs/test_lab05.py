"""Lab 5 catches wrong answers of each kind: wrong values, a number given as text, and each way
gemm.py can be wrong -- the naive starter (right, over the traffic budget), a wrong result, an
unmasked kernel on the ragged shape, a malformed return, wrong parameters, a module that does
not import, one without build, one whose build raises, and none at all; and exercise 5.6 takes
exactly the shapes whose 2:4 speed-up on cuda-like passes the bar, as a list of names."""

from __future__ import annotations

import shutil

from fornax import labs
from fornax.labs.lab05 import CHECK_SHAPES, budget

LAB = labs.get(5)
REF = LAB.reference_dir()


def _folder(tmp_path, gemm: str | None):
    shutil.copy(REF / "answers.toml", tmp_path / "answers.toml")
    if gemm is not None:
        (tmp_path / "gemm.py").write_text(gemm)
    return tmp_path


def _verdict(folder, exercise="5.5"):
    return {v.exercise: v for v in LAB.check(folder)}[exercise]


def test_wrong_values_are_caught(tmp_path):
    folder = _folder(tmp_path, (REF / "gemm.py").read_text())
    text = (folder / "answers.toml").read_text()
    text = (text.replace('"tile64x64x32"', '"tile128x128x32"').replace("= 128", "= 256")
            .replace('"dpas_32x32"', '"dpas_64x64"').replace("= 2064", "= 4128"))
    (folder / "answers.toml").write_text(text)
    got = {v.exercise: v for v in LAB.check(folder)}
    assert not got["5.1"].passed and got["5.1"].expected == "tile64x64x32"
    assert not got["5.2"].passed and got["5.2"].expected == "128" and got["5.2"].observed == "256"
    assert not got["5.3"].passed and got["5.3"].expected == "dpas_32x32"
    assert not got["5.4"].passed and got["5.4"].expected == "2064"
    assert got["5.5"].passed and "within budget" in got["5.5"].observed
    (folder / "answers.toml").write_text(text.replace("= 256", '= "128"'))
    assert not _verdict(folder, "5.2").passed          # a number given as text


def test_the_naive_starter_fails_the_traffic_budget_with_its_bytes(tmp_path):
    v = _verdict(_folder(tmp_path, LAB.starter()["gemm.py"]))
    limit = budget(*CHECK_SHAPES[0])
    assert not v.passed and v.points == 0
    assert "correct, but the kernel moved 2,113,536 B" in v.observed and f"{limit:,} B" in v.observed
    assert "Dot" in v.look_at and "Dot" in v.text
    assert budget(64, 64, 64) == 2 * 4 * (64 * (64 * 2 + 64 * 2) + 64 * 64)


def test_a_wrong_result_fails_correctness_first(tmp_path):
    # the reference with A's K stride wrong (reads A as if it had K+1 columns): also over nothing
    ref = (REF / "gemm.py").read_text()
    wrong = ref.replace('kb.binary("mul", rows, k), ka', 'kb.binary("mul", rows, kb.const(K + 1, "int64")), ka')
    assert wrong != ref
    v = _verdict(_folder(tmp_path, wrong))
    assert not v.passed and "64x64x64: wrong result" in v.observed and "differ from numpy" in v.observed
    # a kernel that tiles but drops the masks: right on 64x64x64, not on the ragged shape
    unmasked = (ref.replace('kb.binary("and", row_ok, kb.binary("lt", ka, k))', "None")
                .replace('kb.binary("and", kb.binary("lt", kr, k), col_ok)', "None"))
    assert unmasked.count("None") == ref.count("None") + 2
    v = _verdict(_folder(tmp_path, unmasked))
    assert not v.passed and v.observed.startswith("75x50x40:"), v.observed


def test_malformed_answers_give_verdicts_not_crashes(tmp_path):
    ref = (REF / "gemm.py").read_text()
    cases = {
        "def build(M, N, K):\n    return 42\n": "returned int, not (program, grid)",
        ref.replace("(-(-N // T), -(-M // T), 1)", "'everywhere'"): "is not up to three integers",
        ref.replace("(-(-N // T), -(-M // T), 1)", "(10 ** 6, 1, 1)"): "instances in all",
        ref.replace('("a", "b", "c")', '("b", "a", "c")'): "want pointers a, b, c in that order",
        "def build(M, N, K):\n    raise RuntimeError('not yet')\n": "raised RuntimeError: not yet",
        "def build(M, N\n": "gemm.py does not import: SyntaxError",
        "x = 1\n": "defines no function build",
    }
    for text, needle in cases.items():
        v = _verdict(_folder(tmp_path, text))
        assert not v.passed and needle in v.observed, (needle, v.observed)
    (tmp_path / "gemm.py").unlink()
    v = _verdict(tmp_path)
    assert not v.passed and v.observed == "no gemm.py"


def test_the_sparsity_exercise_takes_exactly_the_shapes_that_gain(tmp_path):
    from fornax.labs import lab05_sparsity
    rows = {r["shape"]: r for r in lab05_sparsity._sweep() if r["family"] == "cuda-like"}
    assert lab05_sparsity.gainers() == [s for s, r in rows.items() if r["speedup"] > lab05_sparsity.GAIN]
    assert rows["decode"]["speedup"] > lab05_sparsity.GAIN > rows["square"]["speedup"] > 1.1
    assert all("dnnl_unimplemented" in r["refused"] and r["hint"]
               for r in lab05_sparsity._sweep() if r["family"] == "xpu-like")
    folder = _folder(tmp_path, (REF / "gemm.py").read_text())
    text = (folder / "answers.toml").read_text()
    assert 'ex5_6 = ["decode"]' in text
    for given, passed, needle in (('["DECODE "]', True, "DECODE"), ('["decode", "square"]', False, "square"),
                                  ("[]", False, "[]"), ('"decode"', False, "'decode'"),
                                  ('["decode", "tall"]', False, "not shapes of the experiment: tall")):
        (folder / "answers.toml").write_text(text.replace('["decode"]', given))
        v = _verdict(folder, "5.6")
        assert v.passed == passed and needle in v.observed, (given, v.observed)
        assert passed or (v.expected == "['decode']" and "kernel_cost" in v.text)
