"""Lab 3 catches wrong answers of each kind: wrong values, the unfixed (racy) race.py, one that
reads the wrong data, one that raises, and none at all; the reference race.py is race-free on
every family; the partition answers are checked against the drill, and the tenant and
profiling sections hold what their runs measured."""

from __future__ import annotations

import shutil

from fornax import labs

LAB = labs.get(3)


def _folder(tmp_path, race: str | None):
    ref = LAB.reference_dir()
    shutil.copy(ref / "answers.toml", tmp_path / "answers.toml")
    if race is not None:
        (tmp_path / "race.py").write_text(race)
    return tmp_path


def _verdicts(folder):
    return {v.exercise: v for v in LAB.check(folder)}


def test_wrong_values_are_caught(tmp_path):
    folder = _folder(tmp_path, (LAB.reference_dir() / "race.py").read_text())
    text = (folder / "answers.toml").read_text()
    text = (text.replace('"cuda-like"', '"xpu-like"').replace('"read-write"', '"write-write"')
            .replace("= 4", "= 3").replace('"ZE_RESULT_ERROR_DEVICE_LOST"', '"CUDA_ERROR_LAUNCH_TIMEOUT"'))
    (folder / "answers.toml").write_text(text)
    got = _verdicts(folder)
    assert not got["3.1"].passed and got["3.1"].expected == "cuda-like"
    assert not got["3.2"].passed and got["3.2"].expected == "read-write"
    assert not got["3.3"].passed and got["3.3"].expected == "4" and got["3.3"].observed == "3"
    assert not got["3.4"].passed and got["3.4"].expected == "ZE_RESULT_ERROR_DEVICE_LOST"
    assert got["3.5"].passed and "no race" in got["3.5"].observed
    (folder / "answers.toml").write_text(text.replace("= 3", '= "4"'))
    assert not _verdicts(folder)["3.3"].passed          # a number given as text


def test_the_unfixed_race_is_caught_with_what_the_detector_saw(tmp_path):
    folder = _folder(tmp_path, LAB.starter()["race.py"])
    v = _verdicts(folder)["3.5"]
    assert not v.passed and v.points == 0
    assert "race detector reports 1 race(s): read-write" in v.observed
    assert "kernel 'scale3' writes dst" in v.observed and "0x" not in v.observed
    assert "stream_wait_event" in v.look_at and "stream_wait_event" in v.text


def test_wrong_data_raising_and_missing_race_py_are_caught(tmp_path):
    # race-free (everything on one stream) but returns the buffer before reading it back
    wrong = ("import numpy as np\n\ndef run(runtime, module, src, dst, n):\n"
             "    s = runtime.create_stream(in_order=True)\n"
             "    runtime.launch(module, 'scale3', (1, 1, 1), {'src': src, 'dst': dst}, s)\n"
             "    runtime.synchronize()\n    return np.zeros(n, np.float32)\n")
    folder = _folder(tmp_path, wrong)
    v = _verdicts(folder)["3.5"]
    assert not v.passed and "no race, but run returned [0, 0, 0" in v.observed
    (folder / "race.py").write_text("def run(runtime, module, src, dst, n):\n"
                                    "    runtime.stream_wait_event(None, None)\n")
    v = _verdicts(folder)["3.5"]
    assert not v.passed and "cuda-like: run raised" in v.observed
    (folder / "race.py").write_text("def run(:\n")
    v = _verdicts(folder)["3.5"]
    assert not v.passed and "does not import: SyntaxError" in v.observed
    (folder / "race.py").write_text("x = 1\n")
    v = _verdicts(folder)["3.5"]
    assert not v.passed and "does not import" in v.observed and "defines no function run" in v.observed
    (folder / "race.py").unlink()
    v = _verdicts(folder)["3.5"]
    assert not v.passed and v.observed == "no race.py"


def test_the_starter_is_the_racy_program_with_a_marked_fix():
    text = LAB.starter()["race.py"]
    assert "# FIX HERE" in text and "stream_wait_event" not in text.split("# FIX HERE")[1].split("out =")[0]


def test_partition_answers_are_checked_against_the_drill(tmp_path):
    folder = _folder(tmp_path, (LAB.reference_dir() / "race.py").read_text())
    text = (folder / "answers.toml").read_text()
    got = _verdicts(folder)
    assert got["3.6"].passed and got["3.7"].passed
    (folder / "answers.toml").write_text(text.replace('ex3_6 = "cuda-like"', 'ex3_6 = "rocm-like"')
                                         .replace('ex3_7 = "down"', 'ex3_7 = "running"'))
    got = _verdicts(folder)
    assert not got["3.6"].passed and got["3.6"].expected == "cuda-like" and got["3.6"].observed == "rocm-like"
    assert not got["3.7"].passed and got["3.7"].expected == "down"
    assert "[partitions]" in got["3.6"].look_at


def test_the_tenant_and_profiling_sections_come_from_the_runs():
    from fornax.labs import lab03, lab03_profiling, lab03_tenants
    parts = lab03_tenants.partitions()
    assert {p[0] for p in parts} == {"cuda-like", "rocm-like", "xpu-like"}
    assert all(t > whole for *_, t, whole in parts)            # a partition is slower than its chip
    assert all(row[-1] for row in lab03_tenants.faults())       # every drill row held
    for row in lab03_profiling.profiled(lab03._bench, lab03.N, lab03.FAMILIES):
        assert row["kernel"][0] == "scale3" and row["kernel"][1] > 0
        assert row["linked"] and len(row["metrics"]) == 2 and row["calls"]
