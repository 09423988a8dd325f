"""Bad input a user can type or load: each a one-line fornax error (exit 2) naming what was
wrong and what to do, never a traceback, and nothing built before the check."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from fornax.cli.main import main
from fornax.layers.errors import ConfigError
from fornax.sim import tomlfile
from fornax.sim.faults import SpecError

GARBAGE = bytes(range(256)) * 4


def _run(*args):
    out = CliRunner().invoke(main, list(args))
    assert out.exception is None or isinstance(out.exception, SystemExit), out.exc_info
    assert "Traceback" not in out.output
    return out


@pytest.mark.parametrize("command", [["compose", "--vendor", "cuda-like", "--spec"], ["specs"],
                                     ["devices", "--vendor", "rocm-like", "--spec"],
                                     ["compose", "--config"]])
def test_a_binary_garbage_file_is_one_clear_error(command, tmp_path):
    path = tmp_path / "garbage.toml"
    path.write_bytes(GARBAGE)
    out = _run(*command, str(path))
    assert out.exit_code == 2
    assert f"{path} is not UTF-8 text (byte 128 is 0x80); TOML files are UTF-8 text" in out.output


def test_every_toml_loader_refuses_the_same_bad_files_the_same_way(tmp_path):
    for error in (ConfigError, SpecError):
        with pytest.raises(error, match="is a folder, not a file"):
            tomlfile.read(tmp_path, "config file", error)
        with pytest.raises(error, match="does not exist"):
            tomlfile.read(tmp_path / "none.toml", "config file", error)
    bad = tmp_path / "bad.toml"
    bad.write_text("[stack\nvendor = 1\n")
    with pytest.raises(ConfigError, match=r"bad.toml is not valid TOML: .*line 1"):
        tomlfile.read(bad, "config file", ConfigError)
    big = tmp_path / "big.toml"
    with big.open("wb") as f:
        f.truncate(tomlfile.MAX_BYTES + 1)      # sparse: nothing is written
    with pytest.raises(ConfigError, match=f"is {tomlfile.MAX_BYTES + 1} bytes"):
        tomlfile.read(big, "config file", ConfigError)


@pytest.mark.parametrize("args, message", [
    (["--devices", "100000"], "100000 devices is more than one fornax process simulates (at most 1024)"),
    (["--devices", "65", "--topology", "mesh"], "in a full mesh (at most 64)"),
])
def test_too_many_devices_are_refused_before_anything_is_built(args, message):
    t0 = time.perf_counter()
    out = _run("compose", "--vendor", "cuda-like", *args)
    assert out.exit_code == 2 and message in " ".join(out.output.split())
    assert time.perf_counter() - t0 < 30          # was minutes and 15 GiB before a MemoryError


def test_many_devices_render_their_arch_once_with_a_count():
    out = _run("compose", "--vendor", "cuda-like", "--devices", "12")
    assert out.exit_code == 0 and "on sm_90 x12;" in out.output


@pytest.mark.parametrize("args, what", [
    (["gemm", "--m", "99999999999", "--n", "4096", "--k", "4096"], "A, B and C need"),
    (["copy", "--bytes", "100GiB"], "source and destination need"),
    (["allreduce", "--bytes", "1TiB", "--devices", "8"], "the buffer on each device need"),
    (["attention", "--batch", "64", "--heads", "64", "--seq", "65536", "--head-dim", "128"],
     "Q, K, V and the output need"),
])
def test_cost_warns_when_the_operands_exceed_device_memory(args, what):
    out = _run("cost", *args, "--json")
    assert out.exit_code == 0
    doc = json.loads(out.output)
    assert len(doc["warnings"]) == 1 and what in doc["warnings"][0] and "no single device" in doc["warnings"][0]
    out = _run("cost", *args)
    assert "warning:" in out.output and what in " ".join(out.output.split())
    small = _run("cost", "gemm", "--m", "64", "--n", "64", "--k", "64", "--json")
    assert json.loads(small.output)["warnings"] == []
