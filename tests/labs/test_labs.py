"""The labs end to end: each runs live and writes its picture, its committed page is what a
fresh render writes, the packaged reference scores full marks, the blank starter fails with
feedback that says what was expected and where to look, and wrong answers of each kind are
caught; the README's lab list is ``fornax lab list --markdown``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fornax import labs
from fornax.cli.lab import markdown_list
from fornax.cli.main import main
from fornax.labs.render import markdown
from fornax.schemas import validate

ROOT = Path(__file__).resolve().parents[2]
NUMBERS = sorted(labs.LABS)


def _cli(*args: str):
    return CliRunner().invoke(main, ["lab", *args])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every lab run once (the experiments are the slow part)."""
    out = {}
    for n in NUMBERS:
        folder = tmp_path_factory.mktemp(f"lab{n}")
        out[n] = (labs.get(n).run(folder), folder)
    return out


@pytest.mark.parametrize("number", NUMBERS)
def test_the_committed_page_is_a_fresh_render(number, runs):
    lab = labs.get(number)
    sections, folder = runs[number]
    for sec in sections:
        for pic in sec.pictures:
            assert (folder / pic).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert (ROOT / "docs" / "labs" / "img" / lab.slug / pic).is_file()
    page = (ROOT / "docs" / "labs" / f"{lab.slug}.md").read_text(encoding="utf-8")
    assert page == markdown(lab, sections, f"img/{lab.slug}/"), \
        f"docs/labs/{lab.slug}.md is stale: run `fornax lab render {number}` and commit it"


@pytest.mark.parametrize("number", NUMBERS)
def test_reference_scores_full_marks(number):
    res = _cli("check", str(number), "--reference", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    validate(doc)
    assert doc["score"] == doc["out_of"] == sum(e.points for e in labs.get(number).exercises)


@pytest.mark.parametrize("number", NUMBERS)
def test_the_blank_starter_fails_with_feedback_that_teaches(number, tmp_path):
    assert _cli("new", str(number), str(tmp_path)).exit_code == 0
    res = _cli("check", str(number), str(tmp_path), "--json")
    assert res.exit_code == 1
    doc = json.loads(res.output)
    assert doc["score"] == 0
    lab = labs.get(number)
    for ex, row in zip(lab.exercises, doc["exercises"]):
        assert not row["passed"]
        assert row["feedback"].startswith("expected ") and ex.look_at in row["feedback"]
    # the reference answers never show in what run or check print
    again = _cli("new", str(number), str(tmp_path))
    assert again.exit_code == 2 and "already holds" in again.output


def _answers(number: int) -> str:
    return (labs.get(number).reference_dir() / "answers.toml").read_text(encoding="utf-8")


def test_wrong_answers_of_each_kind_are_caught(tmp_path):
    # a wrong name, a wrong number, a number given as text
    text = _answers(9).replace('"mi300x-like"', '"h200-like"').replace("= 197", "= 196")
    (tmp_path / "answers.toml").write_text(text)
    got = {v.exercise: v for v in labs.get(9).check(tmp_path)}
    assert not got["9.1"].passed and "197" in got["9.1"].expected and "196" in got["9.1"].observed
    assert not got["9.2"].passed and got["9.2"].expected == "mi300x-like"
    assert got["9.3"].passed and got["9.4"].passed
    (tmp_path / "answers.toml").write_text(text.replace("= 196", '= "197"'))
    assert not {v.exercise: v for v in labs.get(9).check(tmp_path)}["9.1"].passed
    # a stack config that names the wrong seams, one that is not TOML, and none at all
    lab11 = tmp_path / "l11"
    lab11.mkdir()
    (lab11 / "answers.toml").write_text(_answers(11))
    (lab11 / "stack.toml").write_text('[stack]\nvendor = "rocm-like"\n[stack.seams]\ncompiler = "xpu-like"\n')
    v = {x.exercise: x for x in labs.get(11).check(lab11)}["11.4"]
    assert not v.passed and "compiler=xpu-like" in v.observed and "portability" in v.look_at
    (lab11 / "stack.toml").write_text("[stack\n")
    v = {x.exercise: x for x in labs.get(11).check(lab11)}["11.4"]
    assert not v.passed
    (lab11 / "stack.toml").unlink()
    v = {x.exercise: x for x in labs.get(11).check(lab11)}["11.4"]
    assert not v.passed and v.observed == "no stack.toml"
    # answers that are not TOML, and a folder without answers: clear errors, exit 2
    (tmp_path / "answers.toml").write_text("ex9_1 = = 3")
    res = _cli("check", "9", str(tmp_path))
    assert res.exit_code == 2 and "not valid TOML" in res.output
    res = _cli("check", "9", str(tmp_path / "nowhere"))
    assert res.exit_code == 2


def test_list_run_and_unknown_labs(tmp_path):
    res = _cli("list", "--json")
    assert res.exit_code == 0
    doc = json.loads(res.output)
    validate(doc)
    assert [lab["number"] for lab in doc["labs"]] == NUMBERS
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- labs:begin -->\n", 1)[1].split("\n<!-- labs:end -->", 1)[0]
    assert block == markdown_list(), "README's lab list is stale: paste `fornax lab list --markdown`"
    res = _cli("run", "11", "--out", str(tmp_path / "pics"))
    assert res.exit_code == 0, res.output
    assert "vendor code begins at" in res.output and (tmp_path / "pics" / "front-ends.png").is_file()
    assert "hsaco-like\"" not in res.output and "ex11_" not in res.output
    bad = _cli("run", "42")
    assert bad.exit_code == 2 and "there is no lab 42" in bad.output
