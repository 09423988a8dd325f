"""`fornax baseline save | check`: a saved matrix rerun unchanged passes, a real regression
(fusion switched off, a doctored value, a run that fails) is caught and named, bad input is
exit 2, and the HTML page carries the table and the regression count."""

from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser

import click
import pytest
from click.testing import CliRunner

import fornax.compare
from fornax.cli.baseline import baseline
from fornax.layers.errors import ConfigError
from fornax.release import baseline as base_mod
from fornax.release import plan
from fornax.release.metrics import Tolerance, judge
from fornax.schemas import validate

SMALL = """
[matrix]
vendors = ["cuda-like", "xpu-like"]
frameworks = ["graph"]
workloads = ["mlp"]
specs = ["tiny"]

[tolerances]
device_time_s = { relative = 0.001 }
"""


def cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(click.Group(commands={"baseline": baseline}), ["baseline", *args])
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture
def saved(tmp_path):
    """A baseline ``b`` of the small matrix under ``tmp_path/store``."""
    (tmp_path / "m.toml").write_text(SMALL)
    code, out, err = cli("save", "b", "--matrix", str(tmp_path / "m.toml"), "--dir", str(tmp_path / "store"))
    assert code == 0, err
    assert "saved" in out
    return tmp_path / "store"


def test_saved_baseline_holds_the_matrix_manifest_and_metrics(saved):
    doc = json.loads((saved / "b" / "baseline.json").read_text())
    validate(doc)
    assert doc["schema"] == "fornax.baseline/1"
    assert [r["key"] for r in doc["runs"]] == ["graph/mlp/cuda-like/tiny", "graph/mlp/xpu-like/tiny"]
    assert doc["matrix"]["tolerances"]["device_time_s"] == {"relative": 0.001, "absolute": 0.0}
    assert doc["software"]["fornax"] and doc["software"]["numpy"]
    mt = doc["runs"][0]["metrics"]
    assert mt["kernels"] > 0 and mt["launches"] > 0 and mt["device_time_s"] > 0 and mt["energy_j"] > 0
    assert mt["fallbacks"] == 0 and mt["fallback_ops"] == [] and 0 < mt["max_abs_err[y]"] < 1e-4
    assert "host_wall_s" not in mt                     # a measurement of the machine, never compared


def test_unchanged_rerun_exits_0(saved):
    code, out, err = cli("check", "b", "--dir", str(saved), "--json")
    assert code == 0, err
    doc = json.loads(out)
    validate(doc)
    assert doc["ok"] and doc["regressions"] == 0 and doc["counts"]["same"] == len(doc["rows"]) > 20


def test_fusion_switched_off_is_a_regression_named_by_metric(saved, monkeypatch):
    """A change that stops the compiler fusing (every run's stack composed with fusion off)
    makes more kernels and launches: the check exits 1 and names them."""
    real = fornax.compare.prepare

    def unfused(cfg, *args, **kwargs):
        cfg.fuse = False
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(base_mod, "prepare", unfused)
    code, out, err = cli("check", "b", "--dir", str(saved), "--all")
    assert code == 1, err
    flat = " ".join(out.split())
    assert "kernels" in flat and "launches" in flat and " 0 regressions" not in flat
    doc = base_mod.check("b", saved)
    bad = {(r["run"], r["metric"]) for r in doc["rows"] if r["verdict"] == "regression"}
    assert ("graph/mlp/cuda-like/tiny", "kernels") in bad and ("graph/mlp/cuda-like/tiny", "launches") in bad


def test_doctored_values_give_a_regression_and_an_improvement(saved):
    path = saved / "b" / "baseline.json"
    doc = json.loads(path.read_text())
    doc["runs"][0]["metrics"]["device_time_s"] *= 0.5       # the baseline was faster: now slower
    doc["runs"][1]["metrics"]["kernels"] += 3               # the baseline had more kernels
    doc["runs"][1]["metrics"]["energy_j"] *= 1.0001         # within no tolerance: energy is exact
    path.write_text(json.dumps(doc))
    code, out, _ = cli("check", "b", "--dir", str(saved), "--json")
    assert code == 1
    rows = {(r["run"], r["metric"]): r for r in json.loads(out)["rows"]}
    slow = rows[("graph/mlp/cuda-like/tiny", "device_time_s")]
    assert slow["verdict"] == "regression" and slow["change"] == pytest.approx(1.0)
    assert rows[("graph/mlp/xpu-like/tiny", "kernels")]["verdict"] == "improvement"
    assert rows[("graph/mlp/xpu-like/tiny", "energy_j")]["verdict"] == "improvement"


def test_a_disappearing_metric_and_a_failing_run_are_regressions(saved, monkeypatch):
    path = saved / "b" / "baseline.json"
    doc = json.loads(path.read_text())
    doc["runs"][0]["metrics"]["max_abs_err[z]"] = 0.0       # an output the rerun no longer has
    path.write_text(json.dumps(doc))
    rows = base_mod.check("b", saved)["rows"]
    (gone,) = [r for r in rows if r["metric"] == "max_abs_err[z]"]
    assert gone["verdict"] == "regression" and "disappeared" in gone["why"]

    from fornax.sim.faults import FaultPlan
    real = fornax.compare.execute
    monkeypatch.setattr(base_mod, "execute",
                        lambda prep, **kw: real(prep, faults=FaultPlan.parse("page_fault@1", seed=0)))
    doc = base_mod.check("b", saved)
    runs = [r for r in doc["rows"] if r["metric"] == "run"]
    assert doc["regressions"] == 2 and all(r["verdict"] == "regression" for r in runs)
    assert all("the run failed" in r["why"] for r in runs)


def test_a_software_difference_is_shown_not_a_regression(saved):
    path = saved / "b" / "baseline.json"
    doc = json.loads(path.read_text())
    doc["software"]["numpy"] = "0.0.1"
    path.write_text(json.dumps(doc))
    code, out, _ = cli("check", "b", "--dir", str(saved))
    assert code == 0
    assert "software: numpy 0.0.1 ->" in out and "not a regression by itself" in out


def test_bench_figures_are_compared_against_their_own_targets(tmp_path):
    from pathlib import Path
    src = Path(__file__).resolve().parents[2] / "docs" / "evidence" / "bench.json"
    bench = json.loads(src.read_text())
    (tmp_path / "old.json").write_text(json.dumps(bench))
    (tmp_path / "m.toml").write_text(SMALL.replace('["cuda-like", "xpu-like"]', '["cuda-like"]')
                                     + "bench = { relative = 0.25 }\n")
    store = tmp_path / "store"
    code, _, err = cli("save", "b", "--matrix", str(tmp_path / "m.toml"), "--dir", str(store),
                       "--bench", str(tmp_path / "old.json"))
    assert code == 0, err
    code, _, err = cli("check", "b", "--dir", str(store))
    assert code == 2 and "was saved with --bench" in err
    figs = {f["name"]: f for f in bench["figures"]}
    figs["gpt2.step_vs_cpu[cuda-like]"].update(value=6.0, met=False)     # max target 5x: missed now
    figs["compile.warm_s[cuda-like]"]["value"] *= 1.1                    # within 25 %
    figs["big_tensor.seconds[cuda-like: factory]"].update(value=1.0, met=True)   # now meets 2 s
    (tmp_path / "new.json").write_text(json.dumps(bench))
    code, out, _ = cli("check", "b", "--dir", str(store), "--bench", str(tmp_path / "new.json"), "--json")
    assert code == 1
    rows = {r["metric"]: r for r in json.loads(out)["rows"] if r["run"] == "bench"}
    assert len(rows) == len(figs)
    assert rows["bench.gpt2.step_vs_cpu[cuda-like]"]["verdict"] == "regression"
    assert rows["bench.compile.warm_s[cuda-like]"]["verdict"] == "within"
    assert rows["bench.big_tensor.seconds[cuda-like: factory]"]["verdict"] == "improvement"


def test_judge_directions_and_tolerances():
    tol = Tolerance(relative=0.1)
    assert judge("lower", 1.0, 1.05, tol).verdict == "within"
    assert judge("lower", 1.0, 1.2, tol).verdict == "regression"
    assert judge("lower", 1.0, 0.8, tol).verdict == "improvement"
    assert judge("higher", 1.0, 0.8, tol).verdict == "regression"
    assert judge("lower", 0.0, 1e-9, Tolerance(absolute=1e-6)).verdict == "within"
    assert judge("fewer", ["a"], ["a", "b"], tol).verdict == "regression"
    assert judge("fewer", ["a", "b"], ["a"], tol).verdict == "improvement"
    assert judge("lower", 3, 3, tol).verdict == "same"
    assert judge("lower", 1.0, 0.9, tol, met=(True, False)).verdict == "regression"


@pytest.mark.parametrize("text, needle", [
    ("[matrix]\nvendors = ['cuda-like']\nframeworks = ['graph']\nworkloads = ['mlp']\n", "specs must be a non-empty list"),
    ("[matrix]\nvendors = ['nvidia']\nframeworks = ['graph']\nworkloads = ['mlp']\nspecs = ['tiny']\n", "unknown vendor 'nvidia'"),
    ("[matrix]\nvendors = ['cuda-like']\nframeworks = ['graph']\nworkloads = ['nope']\nspecs = ['tiny']\n", "workload 'nope'"),
    ("[matrix]\nvendors = ['cuda-like']\nframeworks = ['graph']\nworkloads = ['mlp']\nspecs = ['tiny']\n"
     "[tolerances]\nwall = { relative = 1 }\n", "unknown metric 'wall'"),
    ("[matrix]\nvendors = ['cuda-like']\nframeworks = ['graph']\nworkloads = ['mlp']\nspecs = ['tiny']\n"
     "[tolerances]\nkernels = { relative = -1 }\n", "finite number >= 0"),
    ("[matrix]\nvendors = ['cuda-like']\nframeworks = ['graph']\nworkloads = ['mlp']\nspecs = ['tiny']\n"
     "[stack]\nfuse = 'no'\n", "fuse must be true or false"),
    ("import os\n", "not valid TOML"),
])
def test_bad_matrix_is_one_line_and_exit_2(tmp_path, text, needle):
    (tmp_path / "m.toml").write_text(text)
    code, out, err = cli("save", "x", "--matrix", str(tmp_path / "m.toml"), "--dir", str(tmp_path))
    assert code == 2 and needle in err and err.startswith("fornax: error:") and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_bad_names_missing_and_existing_baselines_are_exit_2(saved, tmp_path):
    assert cli("check", "../etc", "--dir", str(saved))[0] == 2
    code, _, err = cli("check", "nope", "--dir", str(saved))
    assert code == 2 and "baselines there: b" in err
    code, _, err = cli("save", "b", "--dir", str(saved))
    assert code == 2 and "already exists" in err and "--force" in err
    (saved / "b" / "baseline.json").write_text("{not json")
    code, _, err = cli("check", "b", "--dir", str(saved))
    assert code == 2 and "damaged" in err


def test_the_default_matrix_ships_and_parses():
    m = plan.load()
    assert m.source == plan.DEFAULT_MATRIX and len(m.runs()) >= 3
    assert set(m.vendors) == {"cuda-like", "rocm-like", "xpu-like"}
    assert m.tolerance("max_abs_err[y]") == m.tolerances["max_abs_err"]
    assert m.tolerance("kernels") == Tolerance()          # not named: exact
    assert plan.from_json(m.to_json()) == m
    with pytest.raises(ConfigError):
        plan.from_json({**m.to_json(), "vendors": []})


# ---- the HTML page -------------------------------------------------------------------------------
class _Page(HTMLParser):
    """The metric rows (their class and cells), the regression count, and anything external."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, list[str]]] = []
        self.ids: dict[str, str] = {}
        self.external: list[str] = []
        self._row: tuple[str, list[str]] | None = None
        self._id: str | None = None
        self._in_metrics = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "link", "img", "iframe") or a.get("src") or (a.get("href") or "").startswith("http"):
            self.external.append(tag)
        if tag == "table":
            self._in_metrics = a.get("id") == "metrics"
        if tag == "tr" and self._in_metrics and a.get("class"):
            self._row = (a["class"], [])
            self.rows.append(self._row)
        if tag == "td":
            self._id = a.get("id")
            if self._row is not None:
                self._row[1].append("")

    def handle_data(self, data):
        if self._id:
            self.ids[self._id] = self.ids.get(self._id, "") + data
        if self._row is not None and self._row[1]:
            self._row[1][-1] += data

    def handle_endtag(self, tag):
        if tag == "td":
            self._id = None
        if tag == "tr":
            self._row = None


def _check_page(text: str, doc: dict) -> None:
    page = _Page()
    page.feed(text)
    assert page.external == []
    assert len(page.rows) == len(doc["rows"])
    assert page.ids["regressions"].strip() == str(doc["regressions"])
    bad = [cells for cls, cells in page.rows if cls == "regression"]
    assert len(bad) == doc["regressions"] > 0
    assert all(cells[6] == "regression" for cells in bad)
    assert any(cells[1] == "device time (simulated)" for cells in bad)


def test_html_page_shows_the_table_and_the_regressions(saved, tmp_path):
    path = saved / "b" / "baseline.json"
    stored = json.loads(path.read_text())
    stored["runs"][0]["metrics"]["device_time_s"] *= 0.5
    path.write_text(json.dumps(stored))
    page = tmp_path / "page.html"
    code, out, _ = cli("check", "b", "--dir", str(saved), "--html", str(page), "--json")
    assert code == 1
    doc = json.loads(out)
    text = page.read_text()
    assert "<style>" in text and "tr.regression" in text and f"{doc['regressions']} regressions</title>" in text
    _check_page(text, doc)                               # always: Python's html.parser
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium:                                         # and the DOM a browser builds from it
        dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                              page.as_uri()], capture_output=True, text=True, timeout=120)
        assert dom.returncode == 0, dom.stderr[-500:]
        _check_page(dom.stdout, doc)


def test_commands_are_registered_on_fornax():
    from fornax.cli.main import main
    assert main.commands["baseline"] is baseline
    assert set(baseline.commands) == {"save", "check"}
    assert "matrix" in main.commands
