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
    assert qc._probe(sys.executable, qc._clean_env()) == (0, "fornax fornax:0")
    code, out = qc._probe(sys.executable, qc._clean_env(TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    assert (code, out) == (0, "privateuseone -")


@pytest.mark.skipif(qc.source_root() is None, reason="fornax was installed from a wheel")
def test_a_fresh_venv_installs_fornax_and_autoloads_it(tmp_path):
    python = qc.fresh_venv_install(qc.source_root(), tmp_path)
    assert qc._probe(python, qc._clean_env()) == (0, "fornax fornax:0")
    # the venv's fornax is its own copy, not this checkout's editable install
    out = qc.subprocess.run([python, "-c", "import fornax; print(fornax.__file__)"],
                            capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert str(tmp_path) in out and str(qc.source_root()) not in out
