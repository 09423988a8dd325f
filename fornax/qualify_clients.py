"""The real clients' plumbing for ``fornax qualify``: what narrows them, and fresh interpreters.

* ``SUITE_ONLY``, ``ZOO_MODELS``, ``JAX_PROGRAMS`` narrow the real-client evidence
  (PyTorch's databases, the transformers zoo, the equinox/optax programs) for quick runs
  and tests of the wiring; the evidence (:mod:`fornax.qualify.clients`,
  :mod:`fornax.qualify.l4_compile`) reads them when it runs.
* :func:`probe` runs ``import torch`` in a fresh interpreter (does the installed package
  register the ``fornax`` device?), :func:`fresh_venv_install` installs fornax from its
  source tree into a new virtual environment: the L0 packaging evidence
  (:mod:`fornax.qualify.l0_device`) and tests/test_packaging.py use them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from importlib import metadata
from pathlib import Path

#: narrow the real-client evidence to these names (empty: all) — for quick runs and tests of
#: the wiring; a qualification's verdict rests on the whole set
SUITE_ONLY: tuple[str, ...] = ()        # OpInfo / ModuleInfo / OptimInfo names
ZOO_MODELS: tuple[str, ...] = ()        # fornax.scenarios.hf_zoo.ZOO names
JAX_PROGRAMS: tuple[str, ...] = ()      # fornax.scenarios.jax_zoo.ZOO names

#: what the fresh interpreter prints: whether fornax registered, and a tensor's device
_PROBE = ("import torch; "
          "print(torch._C._get_privateuse1_backend_name(), "
          "torch.empty(2, device='fornax').device if hasattr(torch, 'fornax') else '-')")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without fornax's and torch's autoload switches, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FORNAX_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env.update(extra)
    return env


def probe(python: str, env: dict[str, str], timeout: float = 180.0) -> tuple[int, str]:
    """Run the probe in ``python``: (exit code, what it printed or its last error line)."""
    r = subprocess.run([python, "-c", _PROBE], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=tempfile.gettempdir())
    text = (r.stdout.strip() or r.stderr.strip().splitlines()[-1:] or [""])
    return r.returncode, text if isinstance(text, str) else text[0]


def entry_point() -> str | None:
    """The installed distribution's ``torch.backends`` entry point named ``fornax``."""
    for ep in metadata.entry_points(group="torch.backends"):
        if ep.name == "fornax":
            return ep.value
    return None


def source_root() -> Path | None:
    """The source tree this fornax was installed from (a checkout with its pyproject.toml),
    or None for an install from a wheel."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "fornax").is_dir() else None


def fresh_venv_install(root: Path, where: Path, timeout: float = 600.0) -> str:
    """Install fornax from ``root`` into a new virtual environment under ``where`` and return
    its interpreter.  The venv gets fornax's dependencies from this environment (every entry
    of its site-packages but fornax's own, linked into a directory the venv's path names), so
    nothing is downloaded; fornax itself is built from a copy of the tree and installed as a
    plain (non-editable) package with this environment's pip and setuptools."""
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True, timeout=timeout)
    python = venv / "bin" / "python"
    deps = where / "deps"
    deps.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        low = entry.name.lower()
        if low.startswith(("fornax", "__editable__")) or entry.suffix == ".pth":
            continue
        (deps / entry.name).symlink_to(entry)
    target_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True, timeout=timeout).stdout.strip()
    Path(target_site, "_fornax_qualify_deps.pth").write_text(f"{deps}\n", encoding="utf-8")
    src = where / "src"                          # a copy: building leaves nothing in the tree
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, src / name)
    shutil.copytree(root / "fornax", src / "fornax",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                        "--no-deps", "--no-build-isolation", "--no-index", str(src)],
                       capture_output=True, text=True, timeout=timeout, env=clean_env())
    if r.returncode:
        raise RuntimeError(f"pip could not install fornax from {root} into a fresh venv: "
                           + " ".join((r.stderr or r.stdout).split())[-400:])
    return str(python)
