"""benchmarks/results.py, benchmarks/summary.py and the README's benchmark table.

Nothing here runs a benchmark or looks at a timing: the collector's document validates
against benchmarks/bench.schema.json, the summary renders a given document into the expected
markdown, ``python -m benchmarks`` writes a valid document around stand-in benchmarks, and
every row of the README's generated table names a figure some benchmark module declares."""

from __future__ import annotations

import json

import jsonschema
import pytest

from benchmarks import results, summary

META = {"date": "2026-01-02T03:04:05+00:00", "python": "3.11.7",
        "versions": {"fornax": "0.1.0", "torch": "2.13.0+cpu", "jax": "0.10.2", "numpy": "2.4.6",
                     "transformers": None},
        "cpu_count": 2, "command": "python -m benchmarks", "wall_s": 600.0}


def _small_doc() -> dict:
    c = results.Collector()
    c.record("torch.eager_add_us[cuda-like]", 21.44, "us", target=30, module="benchmarks.torch_frontend")
    c.record("torch.compiled_block_vs_cpu[rocm-like]", 2.5, "x", target=2.0, module="benchmarks.torch_frontend")
    c.record("opinfo.pass_rate[xpu-like]", 0.975, "fraction", target=0.95, kind="min",
             module="benchmarks.opinfo", note="39 of 40")
    c.record("shape_only.peak_host_rss[cuda-like]", 1.5 * 2**30, "bytes", module="benchmarks.shape_only")
    c.record("mlp.wall_s[jax.jit CPU]", 0.000433, "s", module="benchmarks.__main__")
    c.skip("all_combos", "opt-in: set FORNAX_BENCH_COMBOS=1 (slow)")
    return c.to_doc(dict(META))


def test_the_collectors_document_validates_against_the_schema(tmp_path):
    doc = _small_doc()
    results.validate(doc)
    path = results.write(doc, tmp_path / "out" / "bench.json")
    again = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.validate(again, results.schema())
    assert again == doc
    figs = {f["name"]: f for f in doc["figures"]}
    assert figs["torch.eager_add_us[cuda-like]"]["met"] is True
    assert figs["torch.compiled_block_vs_cpu[rocm-like]"]["met"] is False
    assert figs["opinfo.pass_rate[xpu-like]"] == {
        "name": "opinfo.pass_rate[xpu-like]", "module": "benchmarks.opinfo", "value": 0.975,
        "unit": "fraction", "target": 0.95, "kind": "min", "met": True, "note": "39 of 40"}
    assert "target" not in figs["mlp.wall_s[jax.jit CPU]"] and "met" not in figs["mlp.wall_s[jax.jit CPU]"]


def test_the_default_metadata_validates():
    doc = results.Collector().to_doc(results.metadata_of_run(1.5, ["mlp"]))
    results.validate(doc)
    assert doc["meta"]["cpu_count"] >= 1 and set(results.VERSIONS) <= set(doc["meta"]["versions"])


@pytest.mark.parametrize("spoil", [
    lambda f: f.pop("met"),                       # a target without met
    lambda f: f.update(unit="furlongs"),
    lambda f: f.update(kind="between"),
    lambda f: f.update(met=False),                # met contradicts value <= target
    lambda f: f.update(extra=1),
])
def test_the_schema_refuses_a_spoiled_figure(spoil):
    doc = _small_doc()
    spoil(doc["figures"][0])
    with pytest.raises(jsonschema.ValidationError):
        results.validate(doc)


def test_the_collector_refuses_bad_figures():
    c = results.Collector()
    c.record("a[x]", 1.0, "s")
    with pytest.raises(ValueError, match="twice"):
        c.record("a[x]", 2.0, "s")
    with pytest.raises(ValueError, match="unit"):
        c.record("b", 1.0, "minutes")
    with pytest.raises(ValueError, match="finite"):
        c.record("c", float("nan"), "s")


def test_a_module_records_only_the_names_it_declares():
    from benchmarks import torch_frontend as tf
    with results.collecting() as c:
        tf.FIGURES.record("torch.eager_add_us[cuda-like]", 12.0, "us", target=tf.ADD_TARGET_US)
        with pytest.raises(ValueError, match="declared patterns"):
            tf.FIGURES.record("torch.eager_add_us[nvidia]", 12.0, "us")
        with pytest.raises(ValueError, match="declared patterns"):
            tf.FIGURES.record("torch.eager_mul_us[cuda-like]", 12.0, "us")
    assert [f["name"] for f in c.figures] == ["torch.eager_add_us[cuda-like]"]
    assert c.figures[0]["module"] == "benchmarks.torch_frontend"
    assert results.current() is not c                 # the block's collector is gone afterwards


def test_the_targets_are_where_the_benchmarks_measure_them():
    from benchmarks import all_combos, gpt2_step, jax_frontend, torch_frontend
    assert torch_frontend.ADD_TARGET_US == 30.0
    assert (torch_frontend.COMPILE_TARGET, torch_frontend.COMPILE_MOONSHOT) == (2.0, 1.25)
    assert jax_frontend.JIT_TARGET == 2.0
    assert gpt2_step.STEP_TARGET == 5.0
    assert all_combos.WALL_TARGET_S == 300.0


def test_every_benchmark_declares_its_figures():
    import benchmarks.__main__ as bm
    declared = results.known_patterns()
    assert "benchmarks.__main__" in declared and "benchmarks.big_tensor" in declared
    for name, fn in bm.BENCHMARKS.items():
        if fn.__module__ != "benchmarks.__main__":
            assert fn.__module__ in declared, name


def test_summary_renders_a_small_bench_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_small_doc()), encoding="utf-8")
    assert summary.main([str(path)]) == 0
    assert capsys.readouterr().out == (
        "| figure | value | target | met |\n"
        "|---|---:|---:|:---:|\n"
        "| `torch.eager_add_us[cuda-like]` | 21.4 µs | ≤ 30 µs | yes |\n"
        "| `torch.compiled_block_vs_cpu[rocm-like]` | 2.5x | ≤ 2x | no |\n"
        "| `opinfo.pass_rate[xpu-like]` | 97.5 % | ≥ 95 % | yes |\n")
    assert summary.main([str(path), "--all"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == ["| `shape_only.peak_host_rss[cuda-like]` | 1.5 GiB | — | — |",
                        "| `mlp.wall_s[jax.jit CPU]` | 433 µs | — | — |"]


def test_summary_rewrites_only_the_marked_section(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n\n{summary.BEGIN}\nold\n{summary.END}\n\nafter\n", encoding="utf-8")
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(_small_doc()), encoding="utf-8")
    assert summary.main([str(bench), "--write-readme", str(readme)]) == 0
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# x\n\nbefore\n\n<!-- bench:begin -->\n\nFigures from one run of "
                           "`python -m benchmarks` on a 2-core machine (2026-01-02, 10 min; ")
    assert text.endswith("<!-- bench:end -->\n\nafter\n") and "old" not in text
    assert "2 of 3 targets met. Not run: all_combos (opt-in" in text
    assert [r["figure"] for r in summary.readme_rows(text)] == [
        "torch.eager_add_us[cuda-like]", "torch.compiled_block_vs_cpu[rocm-like]", "opinfo.pass_rate[xpu-like]"]


def test_the_readme_quotes_only_figures_a_benchmark_produces():
    text = summary.README.read_text(encoding="utf-8")
    assert text.count(summary.BEGIN) == 1 and text.count(summary.END) == 1
    rows = summary.readme_rows(text)
    assert rows, "the README's benchmark table is empty: run python -m benchmarks, then --write-readme"
    unknown = [r["figure"] for r in rows if not results.known(r["figure"])]
    assert not unknown, f"the README quotes figures no benchmark declares: {unknown}"
    for r in rows:
        assert r["target"] != "—" and r["met"] in ("yes", "no"), r
    assert len({r["figure"] for r in rows}) == len(rows)


def test_python_m_benchmarks_writes_the_document(tmp_path, monkeypatch):
    """The driver around stand-in benchmarks: figures, a failing benchmark, an opt-in one."""
    import benchmarks.__main__ as bm
    figs = results.Figures("fake.value[{which}]", module="tests.fake_bench")

    def fine():
        figs.record("fake.value[a]", 3.0, "s", target=5.0)

    def broken():
        figs.record("fake.value[b]", 1.0, "count")
        raise RuntimeError("boom")

    monkeypatch.setattr(bm, "BENCHMARKS", {"fine": fine, "broken": broken, "slow": fine})
    monkeypatch.setattr(bm, "OPT_IN", {"slow": "FORNAX_TEST_SLOW_BENCH"})
    monkeypatch.delenv("FORNAX_TEST_SLOW_BENCH", raising=False)
    monkeypatch.setenv(results.JSON_ENV, str(tmp_path / "env.json"))
    try:
        assert bm.main([]) == 1                      # broken raised
        doc = json.loads((tmp_path / "env.json").read_text(encoding="utf-8"))
        results.validate(doc)
        assert [f["name"] for f in doc["figures"]] == ["fake.value[a]", "fake.value[b]"]
        assert doc["meta"]["modules"] == ["fine", "broken"]
        assert doc["meta"]["errors"] == [{"module": "broken", "error": "RuntimeError: boom"}]
        assert [s["module"] for s in doc["meta"]["skipped"]] == ["slow"]
        assert bm.main(["--only", "slow", "--json", str(tmp_path / "cli.json")]) == 0
        doc = json.loads((tmp_path / "cli.json").read_text(encoding="utf-8"))
        assert [f["name"] for f in doc["figures"]] == ["fake.value[a]"] and doc["meta"]["skipped"] == []
    finally:
        results.Figures.registry.pop("tests.fake_bench", None)


def test_the_big_tensor_figures_follow_its_measure(monkeypatch):
    """benchmarks/big_tensor.py (another module's) is wired in defensively: its ``measure(vendor)``
    rows (a dict or a list of dicts) become figures with the 2 s and 1.5 GiB targets; a missing
    module records nothing and says so."""
    import sys
    import types

    import benchmarks.__main__ as bm
    fake = types.ModuleType("benchmarks.big_tensor")

    def measure(vendor):
        row = {"vendor": vendor, "variant": "factory", "seconds": 1.0, "rss_growth_bytes": 2 * 2**30,
               "tensor_bytes": 2**30}
        return row if vendor == "cuda-like" else [row, {**row, "variant": "copy", "seconds": 3.0}]
    fake.measure = measure
    monkeypatch.setitem(sys.modules, "benchmarks.big_tensor", fake)
    with results.collecting() as c:
        bm.big_tensor_main()
    figs = {f["name"]: f for f in c.figures}
    assert len(figs) == 2 * (1 + 2 * (len(bm.BUILTIN_FAMILIES) - 1))
    seconds = figs["big_tensor.seconds[cuda-like: factory]"]
    assert (seconds["target"], seconds["met"], seconds["module"]) == (2.0, True, "benchmarks.big_tensor")
    rss = figs["big_tensor.rss_growth[rocm-like: copy]"]
    assert (rss["target"], rss["met"]) == (1.5 * 2**30, False)
    assert all(results.known(n) for n in figs)

    monkeypatch.setitem(sys.modules, "benchmarks.big_tensor", types.ModuleType("benchmarks.big_tensor"))
    with results.collecting() as c:
        bm.big_tensor_main()
    assert c.figures == [] and c.skipped == [
        {"module": "big_tensor", "reason": "benchmarks/big_tensor.py has no measure(vendor)"}]
