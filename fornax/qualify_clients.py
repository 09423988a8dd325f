"""Evidence for ``fornax qualify`` that comes from real clients, not from fornax's own checks.

Registered into :mod:`fornax.qualify`'s levels (this module is imported at its end):

* **L0 packaging** — the installed distribution declares the ``torch.backends`` entry
  point, and a fresh interpreter's ``import torch`` registers the ``fornax`` device (and
  ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` opts out).  With ``--full``: a fresh virtual
  environment installs fornax from its source tree and the same holds there.
* **L7 profiling** — ``torch.profiler`` with ``ProfilerActivity.PrivateUse1`` yields per-op
  rows whose device time is the simulated time of the kernels each op launched.
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

from .qualify import Outcome, Subject, check

#: what the fresh interpreter prints: whether fornax registered, and a tensor's device
_PROBE = ("import torch; "
          "print(torch._C._get_privateuse1_backend_name(), "
          "torch.empty(2, device='fornax').device if hasattr(torch, 'fornax') else '-')")


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FORNAX_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    env.update(extra)
    return env


def _probe(python: str, env: dict, timeout: float = 180.0) -> tuple[int, str]:
    r = subprocess.run([python, "-c", _PROBE], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=tempfile.gettempdir())
    text = (r.stdout.strip() or r.stderr.strip().splitlines()[-1:] or [""])
    return r.returncode, text if isinstance(text, str) else text[0]


def _entry_point() -> str | None:
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
                       capture_output=True, text=True, timeout=timeout, env=_clean_env())
    if r.returncode:
        raise RuntimeError(f"pip could not install fornax from {root} into a fresh venv: "
                           + " ".join((r.stderr or r.stdout).split())[-400:])
    return str(python)


@check("L0", "packaging", "the installed package autoloads: a fresh interpreter's `import torch` "
       "registers the fornax device (TORCH_DEVICE_BACKEND_AUTOLOAD=0 opts out)", seam="framework",
       measured="fresh interpreters that see the device as they should", relation="==",
       limit="all (2; 3 with --full: a fresh venv installed from the source tree)")
def _l0_packaging(s: Subject) -> Outcome:
    problems, seen = [], []
    ep = _entry_point()
    if ep != "fornax.frameworks.torch.autoload:autoload":
        problems.append(f"the installed distribution's torch.backends entry point is {ep!r}")
    code, out = _probe(sys.executable, _clean_env())
    if code or not out.startswith("fornax fornax:0"):
        problems.append(f"`import torch` in a fresh interpreter: {out or f'exit {code}'}")
    else:
        seen.append("import torch registers fornax")
    code, out = _probe(sys.executable, _clean_env(TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    if code or not out.startswith("privateuseone -"):
        problems.append(f"with TORCH_DEVICE_BACKEND_AUTOLOAD=0 the device still loads: {out or code}")
    else:
        seen.append("TORCH_DEVICE_BACKEND_AUTOLOAD=0 opts out")
    runs = 2
    if s.full:
        runs = 3
        root = source_root()
        if root is None:
            problems.append("--full installs fornax from its source tree; this fornax was "
                            "installed from a wheel, so there is none to install from")
        else:
            with tempfile.TemporaryDirectory(prefix="fornax-venv-") as tmp:
                python = fresh_venv_install(root, Path(tmp))
                code, out = _probe(python, _clean_env())
                if code or not out.startswith("fornax fornax:0"):
                    problems.append(f"in a fresh venv with fornax installed: {out or f'exit {code}'}")
                else:
                    seen.append("a fresh venv installs it and import torch registers fornax")
    good = runs - len(problems) if ep == "fornax.frameworks.torch.autoload:autoload" else 0
    return Outcome(max(good, 0), not problems, "; ".join(problems) or
                   f"entry point {ep}; " + "; ".join(seen))


@check("L7", "profiling", "torch.profiler (ProfilerActivity.PrivateUse1) gives per-op rows with "
       "the device time of each op's kernels", seam="framework",
       measured="profiled device time vs the kernels' simulated time", relation="==",
       limit="equal, every device op timed", dtype="float32", shape="MLP step x [4, 16]")
def _l7_profiling(s: Subject) -> Outcome:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from .qualify import _mlp
    session = s.torch()
    torch.manual_seed(s.config.seed + 70)
    model = _mlp().to("fornax")
    x = torch.randn(4, 16, device="fornax")
    model(x).square().mean().backward()                 # compile outside the window
    driver = s.stack.driver
    session.runtime.synchronize()
    start = driver.counts["launches"]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        model(x).square().mean().backward()
    session.runtime.synchronize()
    launched = [k for k in driver.kernel_log if k.launch > start]
    want = sum(k.duration_s for k in launched) * 1e6
    rows = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    got = sum(e.self_device_time_total for e in prof.events()
              if e.device_type == torch.autograd.DeviceType.PrivateUse1)
    problems = []
    if not launched:
        problems.append("the step launched no kernel")
    if abs(got - want) > 1e-6 * max(want, 1.0):
        problems.append(f"the profile's device time {got:.3f} us is not the kernels' {want:.3f} us")
    ops = sorted({e.key for e in rows if e.key.startswith("aten::")})
    if not ops:
        problems.append("no ATen op row has device time")
    detail = (f"{len(launched)} kernels, {want:.2f} us simulated; device time on "
              f"{', '.join(ops[:6])}{' ...' if len(ops) > 6 else ''}")
    return Outcome(round(got, 3), not problems, "; ".join(problems) or detail)
