"""Packaging: the distribution declares PyTorch's backend autoload entry point, and a fresh
interpreter (and a fresh virtual environment that installs fornax from this tree) gets the
``fornax`` device from a plain ``import torch``."""

from __future__ import annotations

import sys
from importlib import metadata

import pytest

from fornax import qualify_clients as qc


def test_the_entry_point_is_declared():
    eps = {ep.name: ep.value for ep in metadata.entry_points(group="torch.backends")}
    assert eps.get("fornax") == "fornax.frameworks.torch.autoload:autoload"


def test_import_torch_registers_fornax_and_the_switch_opts_out():
    assert qc.probe(sys.executable, qc.clean_env()) == (0, "fornax fornax:0")
    code, out = qc.probe(sys.executable, qc.clean_env(TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    assert (code, out) == (0, "privateuseone -")


@pytest.mark.skipif(qc.source_root() is None, reason="fornax was installed from a wheel")
def test_a_fresh_venv_installs_fornax_and_autoloads_it(tmp_path):
    python = qc.fresh_venv_install(qc.source_root(), tmp_path)
    assert qc.probe(python, qc.clean_env()) == (0, "fornax fornax:0")
    # the venv's fornax is its own copy, not this checkout's editable install
    out = qc.subprocess.run([python, "-c", "import fornax; print(fornax.__file__)"],
                            capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert str(tmp_path) in out and str(qc.source_root()) not in out


@pytest.mark.parametrize("first", ["fornax.frameworks.torch", "fornax.frameworks.torch.register",
                                   "fornax.frameworks.torch.tensors", "fornax.cli.main"])
def test_importing_fornax_first_still_registers_the_device(first):
    # fornax's own import imports torch, whose autoload hook runs while that import is
    # still under way: the hook must step aside, and the device still ends up registered
    code = f"import {first}, torch; print(torch.empty(2, device='fornax').device)"
    r = qc.subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=qc.clean_env(), cwd=qc.tempfile.gettempdir())
    assert (r.returncode, r.stdout.strip()) == (0, "fornax:0"), r.stderr[-600:]
