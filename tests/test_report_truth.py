"""Reports tell the truth on cold runs and cache hits alike.

Every front end's report is built twice on every family, cold (an empty compile cache) and
warm (a fresh stack whose compiler finds every plan on disk, as a second ``fornax compose``
does), and the two documents must be the same except for timings and the cache's own
hit/miss counters, which must say exactly what happened.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.compare import execute, prepare
from fornax.report import render
from fornax.stack import make_config
from helpers import FAMILIES

VENDORS = FAMILIES
#: what may differ between a cold and a warm run: host clocks and the cache's counters
TIMINGS = {"costs.compile_wall_s", "costs.host_wall_s", "seams.compiler.compile_wall_s",
           "torch.reference_wall_s", "jax.reference_wall_s"}
CACHE = {"seams.compiler.cache_hits", "seams.compiler.graphs_compiled",
         "seams.compiler.graphs_from_disk", "seams.compiler.compile_cache.disk_hits",
         "seams.compiler.compile_cache.disk_writes", "seams.compiler.compile_cache.misses"}


def _differences(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            yield from _differences(a.get(k), b.get(k), f"{path}.{k}" if path else k)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield path


def _report(framework, vendor):
    return execute(prepare(make_config(vendor), framework, None)).report


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("framework", ["graph", "torch", "jax"])
def test_a_warm_report_says_what_the_cold_one_says(framework, vendor, tmp_path, monkeypatch):
    monkeypatch.setenv("FORNAX_CACHE_DIR", str(tmp_path))
    cold, warm = _report(framework, vendor), _report(framework, vendor)
    assert set(_differences(cold, warm)) <= TIMINGS | CACHE
    c, w = cold["seams"]["compiler"], warm["seams"]["compiler"]
    plans = c["graphs_compiled"]
    assert plans > 0 and c["compile_cache"]["misses"] == plans and c["graphs_from_disk"] == 0
    assert w["graphs_compiled"] == 0 and w["graphs_from_disk"] == plans and w["cache_hits"] == plans
    assert w["ops_in"] == c["ops_in"] > 0 and w["kernels"] == c["kernels"] > 0
    assert w["binary_bytes"] == c["binary_bytes"] > 0
    assert w["planned_peak_bytes"] == c["planned_peak_bytes"] > 0


def test_the_framework_line_counts_what_the_front_end_captured(tmp_path, monkeypatch):
    monkeypatch.setenv("FORNAX_CACHE_DIR", str(tmp_path))
    rep = _report("torch", "cuda-like")
    seam, routes = rep["seams"]["framework"], rep["torch"]["routes"]
    assert seam["ops_captured"] == sum(routes.values()) > 0
    assert (seam["native"], seam["fallback"]) == (routes["native"], routes["fallback"])
    rep = _report("jax", "cuda-like")
    seam = rep["seams"]["framework"]
    assert seam["ops_captured"] == sum(rep["jax"]["routes"].values()) > 0
    assert seam["device_segments"] == rep["jax"]["counts"]["segments_run"] > 0
    assert "jaxpr equations" in seam["captured_by"]


def test_dumps_on_a_cache_hit_compile_again_and_say_so(tmp_path, monkeypatch):
    monkeypatch.setenv("FORNAX_CACHE_DIR", str(tmp_path / "cache"))
    runner = CliRunner()
    assert runner.invoke(main, ["compose", "--vendor", "xpu-like", "--json"]).exit_code == 0
    dump = tmp_path / "ir"
    out = runner.invoke(main, ["compose", "--vendor", "xpu-like", "--json", "--dump-ir", str(dump)])
    assert out.exit_code == 0, out.output
    cache = json.loads(out.output)["seams"]["compiler"]["compile_cache"]
    assert cache["bypassed"] == 1 and cache["disk_hits"] == 0
    assert sorted(p.name for p in dump.iterdir())[0] == "mlp.00.input.txt"
    monkeypatch.setenv("FORNAX_LOG", "compiler")
    out = runner.invoke(main, ["compose", "--vendor", "xpu-like"])
    assert out.exit_code == 0 and "--- fornax compiler: mlp after decompose ---" in out.output
    assert "1 bypassed to dump" in out.output


def test_a_truncated_table_says_how_many_rows_it_hides():
    from rich.console import Console
    rep = _report("graph", "cuda-like")
    rep["kernels"] = [dict(rep["kernels"][0], name=f"k{i}") for i in range(27)]
    console = Console(record=True, width=200)
    render(rep, console)
    text = console.export_text()
    assert "k19" in text and "k20" not in text and "7 more row(s) not shown of 27; --all" in text
    console = Console(record=True, width=200)
    render(rep, console, all_rows=True)
    text = console.export_text()
    assert "k26" in text and "more row(s)" not in text
