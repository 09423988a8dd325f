"""``fornax compare --all-combos``: one workload over the seam combinations, in worker processes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from rich.console import Console

from fornax import compare_combos
from fornax.cli.main import main
from fornax.layers.errors import ConfigError
from fornax.schemas import SchemaError, validate
from fornax.stack import compose, make_config

CUDA_HOST = ("--where", "driver=cuda-like", "--where", "framework=cuda-like",
             "--where", "runtime=cuda-like")
SEAMS = ("framework", "compiler", "library", "runtime", "driver")


def run(*args, env=None):
    result = CliRunner().invoke(main, ["compare", "--all-combos", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def cuda_host_doc() -> dict:
    code, out, err = run(*CUDA_HOST, "--spec", "tiny", "--jobs", "2", "--json")
    assert code == 0, err
    return json.loads(out)


def test_nine_combinations_on_a_cuda_like_host(cuda_host_doc):
    doc = cuda_host_doc
    validate(doc)
    rows = doc["rows"]
    assert len(rows) == 9 and doc["ok"] and doc["where"] == {"driver": "cuda-like", "framework": "cuda-like",
                                                             "runtime": "cuda-like"}
    assert [tuple(r["seams"][s] for s in SEAMS) for r in rows] == sorted(
        tuple(r["seams"][s] for s in SEAMS) for r in rows)
    assert all(r["numerics_ok"] and r["status"] == "ok" and r["error"] is None for r in rows)
    native = [r for r in rows if len(set(r["seams"].values())) == 1]
    assert len(native) == 1 and native[0]["path"] == "native" and native[0]["overhead"] == 1.0
    assert native[0]["strict"] == "runs" and native[0]["crossings"] == []
    assert doc["baselines"] == [{"driver": "cuda-like", "device_time_s": native[0]["device_time_s"],
                                 "load_s": native[0]["load_s"], "status": "ok", "in_rows": True}]
    assert not doc["all_paths"] and all(r["paths"] == [] for r in rows)
    for r in rows:
        assert r["overhead"] == pytest.approx(r["device_time_s"] / native[0]["device_time_s"])
        assert r["first_run_overhead"] == pytest.approx((r["device_time_s"] + r["load_s"])
                                                        / (native[0]["device_time_s"] + native[0]["load_s"]))
        assert r["device_time_s"] > 0 and r["host_wall_s"] > 0 and r["load_s"] >= 0


def test_paths_are_the_crossings_of_the_composed_stack(cuda_host_doc):
    for r in cuda_host_doc["rows"]:
        crossings = compose(make_config(seams=r["seams"], spec="tiny")).negotiation["crossings"]
        assert r["crossings"] == crossings
        assert r["mechanisms"] == [c["mechanism"] for c in crossings]
        assert r["path"] == ("; ".join(f"{c['mechanism']} {c['name']}" for c in crossings) or "native")
        boundaries = {c["boundary"] for c in crossings}
        assert ("compiler/driver" in boundaries) == (r["seams"]["compiler"] != "cuda-like")
        assert ("library/driver" in boundaries) == (r["seams"]["library"] != "cuda-like")


def test_strict_mode_refuses_exactly_the_cross_family_compiler_or_library(cuda_host_doc):
    for r in cuda_host_doc["rows"]:
        cross = r["seams"]["compiler"] != "cuda-like" or r["seams"]["library"] != "cuda-like"
        assert r["strict"] == ("refused" if cross else "runs"), r["seams"]
        assert (r["strict_error"] is not None) == cross
    s = cuda_host_doc["summary"]
    assert s == {"combinations": 9, "path_rows": 0, "native": 1, "mechanisms": s["mechanisms"],
                 "strict_refused": 8, "failed": 0}
    assert sum(1 for r in cuda_host_doc["rows"] if "marshal" in r["mechanisms"]) == s["mechanisms"]["marshal"]


def test_the_native_baseline_runs_even_when_the_subset_leaves_it_out():
    code, out, err = run("--where", "driver=rocm-like", "--where", "framework=cuda-like",
                         "--where", "compiler=rocm-like", "--where", "library=rocm-like",
                         "--where", "runtime=rocm-like", "--spec", "tiny", "--jobs", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    validate(doc)
    (row,) = doc["rows"]
    (base,) = doc["baselines"]
    assert base["driver"] == "rocm-like" and not base["in_rows"] and base["status"] == "ok"
    assert row["overhead"] == pytest.approx(row["device_time_s"] / base["device_time_s"])
    assert row["strict"] == "runs" and [c["boundary"] for c in row["crossings"]] == ["framework/runtime"]


def test_table_and_summary_line():
    code, out, err = run("--where", "driver=xpu-like", "--where", "framework=xpu-like",
                         "--where", "runtime=xpu-like", "--where", "library=xpu-like",
                         "--where", "compiler=xpu-like", "--spec", "tiny", "--jobs", "1")
    assert code == 0, err
    assert "native" in out and "1 combinations: 1 native" in out and "0 refused under --no-translate" in out


def test_progress_bar_on_a_terminal_only_without_json():
    tty = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}
    only = [a for s in SEAMS for a in ("--where", f"{s}=cuda-like")]
    code, _, err = run(*only, "--spec", "tiny", "--jobs", "1", env=tty)
    assert code == 0 and "done cuda-like/cuda-like/cuda-like/cuda-like/cuda-like" in err
    code, out, err = run(*only, "--spec", "tiny", "--jobs", "1", "--json", env=tty)
    assert code == 0 and err == "" and json.loads(out)["ok"]


@pytest.mark.parametrize("args, fragment", [
    (("--where", "kernel=cuda-like"), "unknown seam 'kernel'"),
    (("--where", "driver=tpu-like"), "unknown vendor 'tpu-like'"),
    (("--where", "driver"), "--where takes SEAM=VENDOR"),
    (("--where", "driver=cuda-like", "--where", "driver=xpu-like"), "fixes seam driver twice"),
    (("--vendors", "cuda-like"), "--all-combos excludes --vendors"),
    (("--stack", "a.toml"), "--all-combos excludes --stack"),
    (("--framework", "tensorflow"), "unknown framework"),
    (("--jobs", "0"), "--jobs takes a positive number"),
    (("--workload", "no-such-workload"), "no-such-workload"),
])
def test_bad_input_is_one_line_exit_2(args, fragment):
    code, out, err = run(*args)
    assert code == 2 and out == "" and fragment in err and len(err.strip().splitlines()) == 1, err


def test_combo_options_need_all_combos():
    result = CliRunner().invoke(main, ["compare", "--where", "driver=cuda-like"])
    assert result.exit_code == 2 and "only go with --all-combos" in result.stderr


def test_a_failing_combination_exits_1(monkeypatch):
    real = compare_combos.execute

    def broken_numerics(prep, **kw):
        out = real(prep, **kw)
        if prep.config.seams["compiler"] == "rocm-like":
            out.report["numerics"] = [{**n, "ok": False} for n in out.report["numerics"]]
        return out
    monkeypatch.setattr(compare_combos, "execute", broken_numerics)
    code, out, err = run("--where", "driver=cuda-like", "--where", "framework=cuda-like",
                         "--where", "runtime=cuda-like", "--where", "library=cuda-like",
                         "--spec", "tiny", "--jobs", "1", "--json")
    assert code == 1 and "1 of 3 combinations failed" in err
    doc = json.loads(out)
    validate(doc)
    assert not doc["ok"] and doc["summary"]["failed"] == 1
    bad = [r for r in doc["rows"] if r["status"] != "ok"]
    assert [r["seams"]["compiler"] for r in bad] == ["rocm-like"] and bad[0]["status"] == "numerics"


def test_plot_writes_a_png(tmp_path, cuda_host_doc):
    pytest.importorskip("matplotlib")
    path = tmp_path / "combos.png"
    compare_combos.plot(cuda_host_doc, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_python_api_and_schema_rejects_a_broken_document(cuda_host_doc):
    assert len(compare_combos.combinations()) == 243
    assert len(compare_combos.combinations(["driver=cuda-like", "compiler=rocm-like"])) == 27
    with pytest.raises(ConfigError):
        compare_combos.sweep([])
    compare_combos.render(cuda_host_doc, Console(record=True, width=200))
    broken = {**cuda_host_doc, "rows": [{**cuda_host_doc["rows"][0], "strict": "maybe"}]}
    with pytest.raises(SchemaError):
        validate(broken)


def test_all_paths_runs_each_declared_alternative_as_its_own_row():
    # a CUDA program on a rocm-like host: ZLUDA by default, HIPIFY as the declared alternative
    where = ("--where", "framework=cuda-like", "--where", "compiler=cuda-like", "--where", "library=cuda-like",
             "--where", "runtime=cuda-like", "--where", "driver=rocm-like")
    code, out, err = run(*where, "--all-paths", "--spec", "tiny", "--jobs", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    validate(doc)
    assert doc["all_paths"] and doc["summary"]["combinations"] == 1 and doc["summary"]["path_rows"] == 1
    default, ported = doc["rows"]
    assert default["paths"] == [] and ported["paths"] == ["hipify-like"]
    assert {c["name"] for c in default["crossings"]} == {"zluda-like"}
    assert {c["name"] for c in ported["crossings"]} == {"hipify-like"}
    assert all(c["forced"] for c in ported["crossings"])
    # the port compiles for the target: nothing translated at load, so it loads faster
    assert ported["load_s"] < default["load_s"] and ported["numerics_ok"] and default["numerics_ok"]
    code, out, err = run(*where, "--all-paths", "--spec", "tiny", "--jobs", "1", env={"COLUMNS": "200"})
    assert code == 0, err
    assert "--path hipify-like" in out and "1 runs through another declared path" in " ".join(out.split())
    res = CliRunner().invoke(main, ["compare", "--all-paths"])
    assert res.exit_code != 0 and "--all-paths only go with --all-combos" in res.output
