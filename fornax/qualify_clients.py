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

#: narrow the real-client evidence to these names (empty: all) — for quick runs and tests of
#: the wiring; a qualification's verdict rests on the whole set
SUITE_ONLY: tuple[str, ...] = ()        # OpInfo / ModuleInfo / OptimInfo names
ZOO_MODELS: tuple[str, ...] = ()        # fornax.scenarios.hf_zoo.ZOO names
JAX_PROGRAMS: tuple[str, ...] = ()      # fornax.scenarios.jax_zoo.ZOO names

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


def _need(*modules: str) -> None:
    """Real-client evidence needs the ``clients`` extra; say so instead of an ImportError."""
    import importlib.util
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(f"this evidence needs {', '.join(missing)}: install fornax[clients] "
                           "(pinned in constraints.txt)")


# ---------------------------------------------------------------------------------------------
# PyTorch's own databases (OpInfo, ModuleInfo, OptimInfo) through PyTorch's device-generic harness
def _family(s: Subject) -> str:
    """The family the torch suite composes: the suite runs whole families in fresh
    processes (``FORNAX_VENDOR``), so a stack that mixes families is refused."""
    names = set(s.config.seams.values())
    if len(names) != 1:
        raise RuntimeError("PyTorch's test suite runs on whole families (FORNAX_VENDOR in a "
                           f"fresh process); this stack mixes {', '.join(sorted(names))}")
    return names.pop()


def _suite(s: Subject, kind: str):
    """The suite's result for ``kind`` on the subject's family (run once per qualification)."""
    _need("pytest", "expecttest")
    from .contracts.torch_suite.runner import run_suite
    cache = s.__dict__.setdefault("torch_suite", {})
    if kind not in cache:
        cache[kind] = run_suite(_family(s), full=s.full, kinds=(kind,), only=SUITE_ONLY)
    return cache[kind]


def _suite_outcome(s: Subject, kind: str) -> Outcome:
    from .contracts.torch_suite.result import target
    res = _suite(s, kind)
    groups = res.kinds.get(kind, {})
    cases = [{"group": g, **c.to_json(), "target": target(kind, g)} for g, c in sorted(groups.items())]
    run = sum(c.run for c in groups.values())
    passed = sum(c.passed for c in groups.values())
    low = {g: (c.rate, target(kind, g)) for g, c in groups.items() if c.rate < target(kind, g)}
    problems = []
    if not run:
        problems.append("no check ran")
    problems += [f"{g} {r:.2%} < {t:.1%}" for g, (r, t) in sorted(low.items())]
    if res.failures:
        f = res.failures[0]
        problems.append(f"{len(res.failures)} failure(s) no known-failure entry names, first "
                        f"{f['name']} {f['dtype']} {f['variant']}: {f['error'][:160]}")
    if res.stale:
        problems.append(f"stale known-failure entries: {', '.join(res.stale[:4])}")
    problems += [f"run broken: {e[:200]}" for e in res.errors[:2]]
    scope = "everything" if s.full else "the deterministic sample"
    if SUITE_ONLY:
        scope += f" narrowed to {', '.join(SUITE_ONLY)}"
    detail = (f"{scope}: {passed}/{run} pass; "
              + ", ".join(f"{g} {c.rate:.2%}" + (f" ({c.known} known)" if c.known else "")
                          for g, c in sorted(groups.items())))
    return Outcome(round(passed / run, 6) if run else 0.0, not problems,
                   "; ".join(problems) or detail, cases)


@check("L2", "opinfo_suite", "PyTorch's OpInfo database through instantiate_device_type_tests: "
       "forward, out=, in-place, noncontiguous and float32 backward match CPU", seam="framework",
       measured="sample pass rate (known failures listed with reasons do not pass)", relation=">=",
       limit="99.5% float32, 99% other dtypes and backward, per dtype",
       dtype="float32, float16, bfloat16, int64, bool, complex64",
       shape="op_db samples made on the device (--full: every OpInfo)")
def _l2_opinfo_suite(s: Subject) -> Outcome:
    return _suite_outcome(s, "ops")


@check("L3", "moduleinfo", "PyTorch's ModuleInfo database: forward, backward, .to()/.cpu()/"
       ".to(dtype) keeping parameter identity and ties, state_dict, deepcopy", seam="framework",
       measured="checks passing", relation="==", limit=1.0, dtype="float32",
       shape="module_db inputs (--full: every ModuleInfo)")
def _l3_moduleinfo(s: Subject) -> Outcome:
    return _suite_outcome(s, "modules")


@check("L5", "optiminfo", "PyTorch's OptimInfo database: optimizer steps match CPU (foreach and "
       "fused where the family claims them)", seam="framework", measured="checks passing",
       relation="==", limit=1.0, dtype="float32", shape="optim_db configurations")
def _l5_optiminfo(s: Subject) -> Outcome:
    return _suite_outcome(s, "optims")


# ---------------------------------------------------------------------------------------------
# real models: the transformers zoo (PyTorch) and the equinox/optax programs (JAX)
def _zoo(s: Subject, modes: tuple[str, ...]) -> Outcome:
    _need("transformers")
    from .scenarios import hf_zoo
    s.torch()
    results = [hf_zoo.run_model(name, None, modes) for name in ZOO_MODELS or hf_zoo.ZOO]
    cases = [r.to_json() for r in results]
    bad = [(r.model, mode, m) for r in results for mode, m in r.modes.items() if not m.ok]
    ran = sum(len(r.modes) for r in results)
    worst = max(((r.model, mode, m) for r in results for mode, m in r.modes.items()
                 if m.max_error is not None), key=lambda t: t[2].max_error, default=None)
    detail = (f"{len(results)} models{' (narrowed)' if ZOO_MODELS else ''}, "
              f"{ran - len(bad)}/{ran} model-modes match CPU")
    if worst:
        detail += f"; largest error {worst[2].max_error:.2e} ({worst[0]} {worst[1]}: {worst[2].worst_tensor})"
    problems = [f"{model} {mode}: " + (m.error or f"{m.worst_tensor} differs by {m.max_error:.2e}")
                for model, mode, m in bad]
    return Outcome(f"{ran - len(bad)}/{ran}", not bad and ran > 0,
                   "; ".join(p[:240] for p in problems[:4]) or detail, cases)


@check("L3", "zoo_backward", "real transformers models (8 architectures) eager forward+backward "
       "on the device match CPU: output, loss and every named gradient", seam="framework",
       measured="models matching CPU", relation="==", limit="all", dtype="float32",
       shape="small configs, random weights")
def _l3_zoo(s: Subject) -> Outcome:
    return _zoo(s, ("eager",))


@check("L4", "zoo_compile", "the same models through torch.compile(backend='fornax') forward+"
       "backward match CPU", seam="compiler", measured="models matching CPU", relation="==",
       limit="all", dtype="float32", shape="small configs, random weights")
def _l4_zoo(s: Subject) -> Outcome:
    return _zoo(s, ("compile",))


@check("L4", "jax_ecosystem", "equinox/optax programs (CNN with max-pooling, attention, lax.scan "
       "GRU, optimisers with schedules) through fornax.frameworks.jax.jit match jax.jit, no host "
       "fallback", seam="compiler", measured="programs matching jax.jit", relation="==",
       limit="all", dtype="float32")
def _l4_jax_ecosystem(s: Subject) -> Outcome:
    _need("equinox", "optax")
    from .scenarios import jax_zoo
    results = [jax_zoo.run_program(name, stack=s.stack) for name in JAX_PROGRAMS or jax_zoo.ZOO]
    bad = [r for r in results if not r.ok]
    problems = []
    for r in bad:
        out, err = r.worst
        problems.append(f"{r.name}: " + (r.error or (f"host fallbacks {[f['primitive'] for f in r.fallbacks]}"
                                                     if r.fallbacks else f"{out} normwise {err:.2e}")))
    worst = max(results, key=lambda r: r.worst[1])
    detail = (f"{len(results)} programs match jax.jit with no host fallback; largest error "
              f"{worst.worst[1]:.2e} ({worst.name} {worst.worst[0]})")
    return Outcome(f"{len(results) - len(bad)}/{len(results)}", not bad,
                   "; ".join(problems) or detail, [r.to_json() for r in results])


@check("L5", "zoo_training", "the models train: 3 AdamW steps (losses and final parameters) and "
       "greedy generate() (token-identical) match CPU", seam="framework",
       measured="models matching CPU", relation="==", limit="all", dtype="float32",
       shape="small configs, random weights")
def _l5_zoo(s: Subject) -> Outcome:
    return _zoo(s, ("train", "generate"))
