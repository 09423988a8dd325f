"""The support contract: does a stack support PyTorch, and up to which level?

``fornax qualify`` answers with evidence.  Eight levels, each a promise a user of
the stack relies on, each backed by one or more focused checks that run real work
through the stack and compare it with a reference (CPU eager PyTorch, ``jax.jit``
on the CPU, numpy in float64)::

    L0 device discovered          L4 compile (torch.compile, fornax jit)
    L1 allocation, copies, views  L5 numerics and autocast
    L2 operator coverage          L6 distributed (two devices)
    L3 autograd                   L7 failure handling and diagnosability

A level passes when all of its evidence passes.  The verdict is the highest level
``L`` such that ``L0`` .. ``L`` all pass ("supports PyTorch up to L4"); every level
is run and shown anyway, so a stack that fails ``L2`` but passes ``L3`` says so.

Each piece of evidence names the check, the build (``Stack.describe()`` plus the
fornax, torch and jax versions), the vendor family of the seam it exercises, the
dtype and shape it used, what was measured (a value against a limit) and why it
passed or failed.  A check that raises records the failure with the error message;
the qualification itself never crashes on the stack under test.

Reuse from Python::

    from fornax.qualify import qualify
    from fornax.stack import make_config
    q = qualify(make_config("xpu-like"))            # or a composed Stack, or levels=["L3"]
    print(q.verdict_text)                           # "... supports PyTorch up to L7"
    doc = q.to_json()                               # the fornax.qualify/1 document

The torch front end serves one stack per process: qualifying switches it to the
stack under test (``fornax.frameworks.torch.use_stack(stack=...)``) and leaves that
stack active and usable afterwards.  The global torch RNG state is restored.
"""

from __future__ import annotations

import functools
import platform
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

import fornax

from .layers.errors import ConfigError, FornaxError
from .sim.faults import FaultPlan, FaultSpec, SpecError
from .sim.spec import load_spec
from .stack import Stack, StackConfig, compose, load_config, make_config

SCHEMA = "fornax.qualify/1"

#: a level passes L2 when at least this share of the OpInfo samples pass
OPINFO_THRESHOLD = 0.95
#: the OpInfos L2 runs (a fixed, named subset of ``fornax.frameworks.torch.opinfo.TOP_OPS``:
#: elementwise math, a comparison-driven select, reductions, matrix products, the layers and
#: losses of the L3/L4 models, a view and a concatenation)
OPINFO_OPS: tuple[str, ...] = (
    "add", "mul", "div.no_rounding_mode", "exp", "tanh", "sigmoid", "where", "sum", "mean", "amax",
    "matmul", "nn.functional.linear", "nn.functional.conv2d", "nn.functional.relu",
    "nn.functional.gelu", "softmax", "nn.functional.layer_norm", "nn.functional.cross_entropy",
    "transpose", "cat",
)
#: samples per OpInfo (the first ones ``sample_inputs`` yields)
OPINFO_SAMPLES = 3

#: normwise relative error limits, ``max|got - ref| / max|ref|``: float32 work against a
#: CPU float32 run or a float64 reference (a few float32 roundings, far below the ~1e-3 a
#: silent bfloat16 or TF32 downgrade gives), and one rounding to a 16-bit float with float32
#: accumulation (2^-11 for float16, 2^-8 for bfloat16, doubled)
TOL = {"float32": 1e-5, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


@dataclass(frozen=True)
class Level:
    id: str
    title: str
    promise: str


LEVELS: tuple[Level, ...] = (
    Level("L0", "device discovered",
          "the driver enumerates the device and describes it; PyTorch (torch.fornax) and JAX "
          "see it in the family's vocabulary; the installed package registers it on `import torch`"),
    Level("L1", "allocation, copies, views",
          "tensors go to the device and back bit-exactly; views, strides and in-place writes "
          "through views keep PyTorch semantics; memory statistics follow allocations"),
    Level("L2", "operator coverage",
          f"PyTorch's OpInfo samples of {len(OPINFO_OPS)} named operators match CPU eager on "
          f"at least {OPINFO_THRESHOLD:.0%} of samples, and PyTorch's whole OpInfo database "
          "through its device-generic harness meets the per-dtype targets with every remaining "
          "failure listed with its reason (a deterministic sample; everything with --full)"),
    Level("L3", "autograd",
          "an MLP and a small CNN train-step (forward and backward) on the device match CPU eager; "
          "PyTorch's ModuleInfos pass; eight real transformers architectures' forward and "
          "every gradient match CPU"),
    Level("L4", "compile",
          "torch.compile(backend='fornax') forward+backward matches eager CPU (an MLP and the "
          "real models), and fornax.frameworks.jax.jit of an MLP's value and gradient and of "
          "equinox/optax programs matches jax.jit"),
    Level("L5", "numerics and autocast",
          "float32 results are within float32 tolerance of float64 references; "
          "torch.autocast('fornax') runs a matmul in the family's policy dtype; bfloat16 "
          "within bfloat16 tolerance; PyTorch's OptimInfos step as on CPU; the real models train "
          "(AdamW) and generate as on CPU"),
    Level("L6", "distributed",
          "the stack composed with two devices: the library's all-reduce gives the sum; the "
          "framework face names the distributed backend"),
    Level("L7", "failure handling",
          "an injected device fault and an out-of-memory give a clear error with the family's "
          "vendor code and a hint, and the process keeps working; a bad config is a one-line "
          "error; torch.profiler shows each op's device time"),
)
LEVEL_IDS = tuple(lv.id for lv in LEVELS)


# ---------------------------------------------------------------------------------------------
# evidence
@dataclass(frozen=True)
class Check:
    """One focused evidence check: what it measures, against what limit, on which seam."""

    level: str
    name: str
    title: str
    seam: str | None               # the seam whose family answers (its vendor is the row's);
    #                                None: the stack as a whole (the row names every family)
    measured: str                  # what the value is
    relation: str                  # how the value meets the limit: "<=", ">=" or "=="
    limit: float | int | str | None
    dtype: str | None
    shape: str | None
    fn: Callable


@dataclass
class Outcome:
    """What a check measured: the value, whether it meets the limit, and a detail line."""

    value: float | int | str | bool | None
    passed: bool
    detail: str
    cases: list | None = None      # per-item results (L2: one per OpInfo)


@dataclass
class Evidence:
    """One row of evidence: a check's metadata, the build it ran on and its outcome."""

    check: Check
    build: str
    vendor: str
    value: float | int | str | bool | None
    passed: bool
    detail: str
    wall_s: float
    error: str | None = None
    cases: list | None = None
    traceback: str | None = None   # kept for --debug, not part of the document

    def to_json(self) -> dict:
        c = self.check
        doc = {"check": f"{c.level}.{c.name}", "title": c.title, "build": self.build,
               "seam": c.seam, "vendor": self.vendor, "dtype": c.dtype, "shape": c.shape,
               "measured": c.measured, "value": _jsonable(self.value), "relation": c.relation,
               "limit": c.limit, "passed": self.passed, "detail": self.detail,
               "error": self.error, "wall_s": round(self.wall_s, 4)}
        if self.cases is not None:
            doc["cases"] = self.cases
        return doc


@dataclass
class LevelResult:
    level: Level
    ran: bool
    evidence: list[Evidence] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.ran and bool(self.evidence) and all(e.passed for e in self.evidence)

    @property
    def status(self) -> str:
        return "not run" if not self.ran else "pass" if self.passed else "fail"

    def to_json(self) -> dict:
        lv = self.level
        return {"level": lv.id, "title": lv.title, "promise": lv.promise, "status": self.status,
                "evidence_passed": sum(e.passed for e in self.evidence),
                "evidence_total": len(self.evidence),
                "wall_s": round(sum(e.wall_s for e in self.evidence), 4),
                "evidence": [e.to_json() for e in self.evidence]}


@dataclass
class Qualification:
    """The answer: every level with its evidence, and the verdict."""

    stack: str                     # Stack.describe() (or the config's seams if it did not compose)
    config: dict
    build: dict
    levels: list[LevelResult]
    wall_s: float
    full: bool = False             # the real-client evidence ran whole, not sampled

    @property
    def verdict(self) -> str | None:
        """The highest level L such that L0 .. L all pass (None: L0 did not pass or was not run)."""
        best = None
        for lr in self.levels:
            if not lr.passed:
                break
            best = lr.level.id
        return best

    @property
    def passed(self) -> bool:
        """Every level that ran passed."""
        return all(lr.passed for lr in self.levels if lr.ran)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    @property
    def verdict_text(self) -> str:
        ran = [lr for lr in self.levels if lr.ran]
        passed = [lr.level.id for lr in ran if lr.passed]
        failed = [lr.level.id for lr in ran if not lr.passed]
        if len(ran) < len(self.levels):
            said = "; ".join(f"{label}: {', '.join(ids)}"
                             for label, ids in (("pass", passed), ("fail", failed)) if ids)
            return (f"{self.stack}: {said} (only {', '.join(lr.level.id for lr in ran)} run; "
                    "the verdict needs every level)")
        if self.verdict is None:
            return f"{self.stack} does not support PyTorch: L0 fails"
        tail = "every level passes" if not failed else f"failing: {', '.join(failed)}"
        return f"{self.stack} supports PyTorch up to {self.verdict} ({tail})"

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "stack": self.stack, "config": self.config, "build": self.build,
                "levels_run": [lr.level.id for lr in self.levels if lr.ran],
                "verdict": self.verdict, "verdict_text": self.verdict_text,
                "passed": self.passed, "full": self.full, "opinfo_threshold": OPINFO_THRESHOLD,
                "wall_s": round(self.wall_s, 3),
                "levels": [lr.to_json() for lr in self.levels]}


def _jsonable(v):
    if isinstance(v, (np.floating, np.integer, np.bool_)):
        return v.item()
    if isinstance(v, float) and not np.isfinite(v):
        return str(v)
    return v


CHECKS: list[Check] = []


def check(level: str, name: str, title: str, *, seam: str | None, measured: str, relation: str,
          limit, dtype: str | None = None, shape: str | None = None):
    """Register the decorated ``fn(subject) -> Outcome`` as evidence of ``level``."""
    def deco(fn):
        CHECKS.append(Check(level, name, title, seam, measured, relation, limit, dtype, shape, fn))
        return fn
    return deco


# ---------------------------------------------------------------------------------------------
# the subject: the stack under test, composed once
def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


class Subject:
    """The stack under test.  Composed on first use; a stack that does not compose fails
    every check with the composition error (the question "does it support PyTorch" then has
    its answer at L0)."""

    def __init__(self, target: StackConfig | Stack):
        if isinstance(target, Stack):
            self.config, self._stack, self._error = target.config, target, None
        else:
            self.config, self._stack, self._error = target, None, None
        self.torch_used = False
        self.full = False                # the real-client evidence whole, not sampled
        self.current = ""                # the check running now (``L0.driver``)
        self._error_at = ""
        self.versions = {"fornax": fornax.__version__, "torch": _version("torch"),
                         "jax": _version("jax"), "python": platform.python_version(),
                         "numpy": np.__version__}

    @property
    def stack(self) -> Stack:
        if self._stack is None:
            if self._error is not None:     # the full error is on the first check that met it
                raise ConfigError(f"the stack did not compose (see {self._error_at})")
            try:
                self._stack = compose(self.config)
            except FornaxError as exc:
                self._error, self._error_at = exc, self.current
                raise
        return self._stack

    def describe(self) -> str:
        if self._stack is not None or self._error is None:
            try:
                return self.stack.describe()
            except FornaxError:
                pass
        names = sorted(set(self.config.seams.values()))
        who = names[0] if len(names) == 1 else ", ".join(f"{k}={v}" for k, v in self.config.seams.items())
        return f"{who} on {self.config.spec}"

    def build(self, stack: Stack | None = None) -> str:
        """The stack in words with the software versions (what each evidence row ran on)."""
        v = self.versions
        if stack is not None:
            who = stack.describe()
            n = stack.config.devices
        else:
            who, n = self.describe(), self.config.devices
        return (f"{who}{f' x {n} devices' if n > 1 else ''}; fornax {v['fornax']}, "
                f"torch {v['torch']}, jax {v['jax']}")

    def derived(self, **changes) -> StackConfig:
        """A config like the subject's with ``changes`` (devices=2, ...)."""
        return make_config(base=self.config, **changes)

    def torch(self, stack: Stack | None = None):
        """Make ``stack`` (default: the stack under test) the torch front end's active stack."""
        import fornax.frameworks.torch as ft
        from .frameworks.torch import session as tsession
        stack = stack if stack is not None else self.stack
        self.torch_used = True
        if tsession.initialized() and tsession.current().stack is stack:
            return tsession.current()
        return ft.use_stack(stack=stack)


def qualify(target: StackConfig | Stack, levels: Iterable[str] | None = None,
            progress: Callable[[str], None] | None = None, full: bool = False) -> Qualification:
    """Run the evidence of ``levels`` (default: all, L0..L7) against the stack ``target``
    (a config, composed here, or an already composed Stack) and return the qualification.
    ``progress(check_id)`` is called before each check (``"L2.opinfo"``).  ``full`` runs the
    real-client evidence whole (every OpInfo, ModuleInfo and OptimInfo, a fresh venv for
    packaging) instead of its deterministic sample."""
    wanted = list(LEVEL_IDS) if levels is None else [normalize_level(lv) for lv in levels]
    if not wanted:
        raise ConfigError("no level to run", hint=f"levels: {', '.join(LEVEL_IDS)}")
    config = target.config if isinstance(target, Stack) else target
    if config.meta:
        raise ConfigError("a shape-only (meta) stack computes no values, so it cannot be "
                          "qualified", hint="set meta = false in the stack config")
    try:
        load_spec(config.spec)
    except SpecError as exc:
        raise ConfigError(str(exc)) from None
    subject = Subject(target)
    subject.full = bool(full)
    t0 = time.perf_counter()
    results = [LevelResult(lv, lv.id in wanted) for lv in LEVELS]
    import torch
    with torch.random.fork_rng(devices=[]):
        for lr in results:
            if not lr.ran:
                continue
            for c in CHECKS:
                if c.level == lr.level.id:
                    if progress is not None:
                        progress(f"{c.level}.{c.name}")
                    lr.evidence.append(_run(subject, c))
        if subject.torch_used:
            try:                    # leave the stack under test active and usable
                subject.torch()
            except FornaxError:
                pass
    return Qualification(subject.describe(), config.describe(), subject.versions, results,
                         time.perf_counter() - t0, subject.full)


def normalize_level(text) -> str:
    """``"L3"``, ``"l3"`` or ``"3"`` -> ``"L3"``; anything else is a ConfigError."""
    s = str(text).strip().upper()
    if not s.startswith("L"):
        s = "L" + s
    if s not in LEVEL_IDS:
        raise ConfigError(f"unknown level {text!r}; levels: {', '.join(LEVEL_IDS)}")
    return s


def _run(subject: Subject, c: Check) -> Evidence:
    seams = subject.config.seams
    vendor = seams[c.seam] if c.seam else ", ".join(sorted(set(seams.values())))
    subject.current = f"{c.level}.{c.name}"
    t = time.perf_counter()
    try:
        out = c.fn(subject)
        return Evidence(c, _build_of(subject, out), vendor, out.value, bool(out.passed), out.detail,
                        time.perf_counter() - t, cases=out.cases)
    except Exception as exc:     # the stack under test misbehaved: record it, go on
        msg = " ".join(str(exc).split()) or type(exc).__name__
        return Evidence(c, subject.build(), vendor, None, False,
                        f"raised {type(exc).__name__}: {msg}", time.perf_counter() - t,
                        error=f"{type(exc).__name__}: {msg}", traceback=traceback.format_exc())


def _build_of(subject: Subject, out: Outcome) -> str:
    return getattr(out, "build", None) or subject.build()


# ---------------------------------------------------------------------------------------------
# measuring
def normwise(got, ref) -> float:
    """``max|got - ref| / max|ref|`` in float64 (inf on a shape mismatch or a NaN the
    reference does not have)."""
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if g.shape != r.shape:
        return float("inf")
    if g.size == 0:
        return 0.0
    if np.any(np.isnan(g) != np.isnan(r)):
        return float("inf")
    scale = max(float(np.nanmax(np.abs(r))), np.finfo(np.float64).tiny)
    return float(np.nanmax(np.abs(g - r)) / scale)


def _np(t) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def _fmt(x: float) -> str:
    return f"{x:.2e}"


def _worst(pairs: dict[str, tuple]) -> tuple[float, str]:
    """The largest normwise error over named (got, ref) pairs, and its name."""
    errs = {name: normwise(_np(g) if hasattr(g, "detach") else g, _np(r) if hasattr(r, "detach") else r)
            for name, (g, r) in pairs.items()}
    name = max(errs, key=errs.get)
    return errs[name], name


# ---------------------------------------------------------------------------------------------
# L0 device discovered
@check("L0", "driver", "the driver enumerates the devices and describes them", seam="driver",
       measured="devices enumerated", relation="==", limit="the config's device count")
def _l0_driver(s: Subject) -> Outcome:
    stack = s.stack
    drv = stack.driver
    n = drv.device_count()
    props = [drv.properties(i) for i in range(n)]
    problems = []
    if n != stack.config.devices:
        problems.append(f"{n} devices enumerated, the config composed {stack.config.devices}")
    for p in props:
        if not p.name or not p.target:
            problems.append(f"device {p.index} has no name or arch target")
        if p.memory_bytes != stack.spec.hbm_bytes:
            problems.append(f"device {p.index} reports {p.memory_bytes} bytes of memory, the "
                            f"chip has {stack.spec.hbm_bytes}")
        if not p.native:
            problems.append(f"device {p.index} has no properties in the family's vocabulary")
    p = props[0] if props else None
    desc = (f"{p.name}: {p.target}, {p.compute_units} units, SIMD {p.simd_width}, "
            f"{p.memory_bytes / 2**30:.1f} GiB; native: {', '.join(sorted(p.native)[:4])}"
            if p else "no device")
    return Outcome(n, not problems and n > 0, "; ".join(problems) or desc)


@check("L0", "torch", "torch.fornax is_available / device_count / get_device_properties in "
       "the family's vocabulary", seam="framework", measured="face property fields present",
       relation="==", limit="every field of the family's face")
def _l0_torch(s: Subject) -> Outcome:
    import torch
    session = s.torch()
    fw = session.framework
    face = fw.face
    props = torch.fornax.get_device_properties()
    drv = s.stack.driver.properties(0)
    want = [name for name, _ in fw.torch_face.properties]
    have = [name for name in want if hasattr(props, name)]
    problems = []
    if not torch.fornax.is_available():
        problems.append("torch.fornax.is_available() is False")
    if torch.fornax.device_count() != 1:
        problems.append(f"torch.fornax.device_count() is {torch.fornax.device_count()}, not 1")
    if len(have) != len(want):
        problems.append(f"missing property fields: {', '.join(n for n in want if n not in have)}")
    seam_says = fw.device_properties(s.stack.driver, 0)
    differ = [k for k, v in seam_says.items() if getattr(props, k, None) != v]
    if differ:
        problems.append(f"fields differ from the framework seam's answer: {', '.join(differ)}")
    if not getattr(props, "name", None):
        problems.append("the device has no name")
    if "total_memory" in want and getattr(props, "total_memory", None) != drv.memory_bytes:
        problems.append(f"total_memory {getattr(props, 'total_memory', None)} is not the driver's "
                        f"{drv.memory_bytes}")
    version = getattr(torch.fornax.version, face.version_field, None)
    if version != face.version:
        problems.append(f"torch.fornax.version.{face.version_field} is {version!r}, the face says "
                        f"{face.version!r}")
    detail = (f"{face.module} face, device type {face.device_type!r}, {props.name}; "
              f"version.{face.version_field} = {version}; {len(have)} property fields")
    return Outcome(f"{len(have)}/{len(want)}", not problems, "; ".join(problems) or detail)


@check("L0", "jax", "the JAX client lists the devices on the family's platform", seam="framework",
       measured="client devices", relation="==", limit="the driver's device count")
def _l0_jax(s: Subject) -> Outcome:
    from .frameworks.jax import resolve
    client = resolve(s.stack)
    devs = client.devices()
    drv = s.stack.driver
    face = s.stack.framework.face
    problems = []
    if len(devs) != drv.device_count():
        problems.append(f"{len(devs)} client devices, the driver enumerates {drv.device_count()}")
    for d in devs:
        if d.device_kind != drv.properties(d.id).name:
            problems.append(f"device {d.id} kind {d.device_kind!r} is not the driver's name")
    if client.platform != face.pjrt_platform:
        problems.append(f"platform {client.platform!r} is not the face's {face.pjrt_platform!r}")
    detail = (f"platform {client.platform!r} (plugin {client.plugin}, {client.platform_version}); "
              f"{', '.join(repr(d) for d in devs)}: {devs[0].device_kind if devs else '-'}")
    return Outcome(len(devs), not problems and bool(devs), "; ".join(problems) or detail)


# ---------------------------------------------------------------------------------------------
# L1 allocation, copies, views
_ROUNDTRIP = ("float32", "float16", "bfloat16", "int64", "bool")


@check("L1", "roundtrip", "host -> device -> host round trip is bit-exact (NaN, inf, -0.0, "
       "subnormals included)", seam="runtime", measured="elements whose bits differ",
       relation="==", limit=0, dtype=", ".join(_ROUNDTRIP), shape="[3, 5, 7]")
def _l1_roundtrip(s: Subject) -> Outcome:
    import torch
    s.torch()
    g = torch.Generator().manual_seed(s.config.seed)
    bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
    differ, per = 0, []
    for name in _ROUNDTRIP:
        dtype = getattr(torch, name)
        if dtype.is_floating_point:
            x = (torch.randn(3, 5, 7, generator=g) * 100).to(dtype)
            flat = x.view(-1)
            flat[:5] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0,
                                     torch.finfo(dtype).tiny / 4], dtype=dtype)
        elif dtype == torch.bool:
            x = torch.rand(3, 5, 7, generator=g) > 0.5
        else:
            x = torch.randint(-2**62, 2**62, (3, 5, 7), generator=g, dtype=dtype)
        back = x.to("fornax").cpu()
        if back.dtype != dtype or back.shape != x.shape:
            differ += x.numel()
            per.append(f"{name}: came back as {back.dtype}{list(back.shape)}")
            continue
        if dtype in bits:
            n = int((back.view(bits[dtype]) != x.view(bits[dtype])).sum())
        else:
            n = int((back != x).sum())
        differ += n
        if n:
            per.append(f"{name}: {n} elements differ")
    return Outcome(differ, differ == 0, "; ".join(per) or f"{len(_ROUNDTRIP)} dtypes bit-exact")


_VIEWS = {
    "t[1:4, ::2]": lambda t: t[1:4, ::2],
    "t.t()": lambda t: t.t(),
    "t[2]": lambda t: t[2],
    "t[:, 3:5].T": lambda t: t[:, 3:5].T,
    "t.view(4, 12)[1:]": lambda t: t.view(4, 12)[1:],
    "t.unsqueeze(0).expand(3, 6, 8)": lambda t: t.unsqueeze(0).expand(3, 6, 8),
    "t.as_strided((3, 3), (9, 2), 5)": lambda t: t.as_strided((3, 3), (9, 2), 5),
    "t.reshape(2, 24)[:, 1::5]": lambda t: t.reshape(2, 24)[:, 1::5],
}


def _mutate(t):
    """In-place writes through views of ``t`` (exact in float32, so CPU and device agree
    bit for bit)."""
    t[1:4, ::2].mul_(2)
    t.t()[3].add_(1)
    t[:, 5].zero_()
    t.view(4, 12)[2, 3:9].copy_(t[0, :6].clone())
    return t


@check("L1", "views", "views, strides and storage offsets match CPU; in-place writes through "
       "views reach the base", seam="framework", measured="mismatches against CPU",
       relation="==", limit=0, dtype="float32", shape="[6, 8] and 8 views of it")
def _l1_views(s: Subject) -> Outcome:
    import torch
    session = s.torch()
    g = torch.Generator().manual_seed(s.config.seed + 1)
    x = torch.randn(6, 8, generator=g)
    d = x.to("fornax")
    bad = []
    base_ptr = session.address(d.data_ptr())
    for name, fn in _VIEWS.items():
        cv, dv = fn(x), fn(d)
        if (dv.shape, dv.stride(), dv.storage_offset()) != (cv.shape, cv.stride(), cv.storage_offset()):
            bad.append(f"{name}: size/stride/offset {list(dv.shape)}/{dv.stride()}/"
                       f"{dv.storage_offset()} vs CPU {list(cv.shape)}/{cv.stride()}/{cv.storage_offset()}")
        elif session.address(dv.data_ptr()) != base_ptr + 4 * dv.storage_offset():
            bad.append(f"{name}: does not alias the base's storage")
        elif not torch.equal(dv.cpu(), cv):
            bad.append(f"{name}: values differ")
    if not torch.equal(_mutate(d).cpu(), _mutate(x.clone())):
        bad.append("in-place writes through views: the base differs from CPU")
    return Outcome(len(bad), not bad, "; ".join(bad) or
                   f"{len(_VIEWS)} views alias the base with CPU's sizes, strides and offsets; "
                   "4 in-place writes through views agree bit for bit")


@check("L1", "memory", "memory statistics move with an allocation and come back after it is "
       "freed", seam="runtime", measured="bytes memory_allocated() grew by", relation=">=",
       limit=4 << 20, dtype="float32", shape="[1048576]")
def _l1_memory(s: Subject) -> Outcome:
    import torch
    s.torch()
    nbytes = 4 << 20
    before = torch.fornax.memory_allocated()
    t = torch.empty(nbytes // 4, device="fornax")
    during = torch.fornax.memory_allocated()
    peak = torch.fornax.max_memory_allocated()
    reserved = torch.fornax.memory_reserved()
    del t
    after = torch.fornax.memory_allocated()
    problems = []
    if during - before < nbytes:
        problems.append(f"memory_allocated grew by {during - before} bytes for a {nbytes}-byte tensor")
    if peak < during:
        problems.append(f"max_memory_allocated {peak} is below memory_allocated {during}")
    if reserved < during:
        problems.append(f"memory_reserved {reserved} is below memory_allocated {during}")
    if after != before:
        problems.append(f"after del, memory_allocated is {after}, was {before} before")
    return Outcome(during - before, not problems, "; ".join(problems) or
                   f"allocated {before} -> {during} -> {after} bytes; peak {peak}, reserved {reserved}")


# ---------------------------------------------------------------------------------------------
# L2 operator coverage
@check("L2", "opinfo", f"PyTorch OpInfo samples of {len(OPINFO_OPS)} operators match CPU eager",
       seam="framework", measured="sample pass rate", relation=">=", limit=OPINFO_THRESHOLD,
       dtype="float32", shape=f"OpInfo sample_inputs, first {OPINFO_SAMPLES} per operator")
def _l2_opinfo(s: Subject) -> Outcome:
    from .frameworks.torch.opinfo import run_opinfo
    s.torch()
    summary = run_opinfo(OPINFO_OPS, max_samples=OPINFO_SAMPLES)
    cases = [{"name": r.name, "samples": r.run, "passed": r.passed, "native": r.native,
              "error": r.first_error or None} for r in summary.results]
    idle = [r.name for r in summary.results if r.run == 0]
    failing = summary.failing()
    ok = summary.rate >= OPINFO_THRESHOLD and not idle
    parts = [f"{summary.passed}/{summary.run} samples of {len(OPINFO_OPS)} ops pass; "
             f"{len(summary.native)}/{len(OPINFO_OPS)} ops stay on the device"]
    if idle:
        parts.append(f"no sample ran for {', '.join(idle)}")
    if failing:
        parts.append("failing: " + "; ".join(f"{r.name} ({r.failed}/{r.run}: {r.first_error[:120]})"
                                             for r in failing[:4]))
    else:
        parts.append("ops: " + ", ".join(OPINFO_OPS))
    return Outcome(round(summary.rate, 4), ok, "; ".join(parts), cases)


# ---------------------------------------------------------------------------------------------
# L3 autograd
@functools.lru_cache(maxsize=None)
def _models() -> tuple[type, type]:
    """The MLP and CNN of L3/L4, as classes of their own: torch.compile caches per code
    object, so the models must not share ``forward`` with other modules of the process."""
    import torch
    nn = torch.nn

    class MLP(nn.Module):
        out_features = 8

        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

        def forward(self, x):
            return self.fc2(nn.functional.gelu(self.fc1(x)))

    class CNN(nn.Module):
        out_features = 5

        def __init__(self):
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(64, 5)

        def forward(self, x):
            return self.fc(nn.functional.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1))

    return MLP, CNN


def _mlp():
    return _models()[0]()


def _cnn():
    return _models()[1]()


def _train_step(s: Subject, build, shape: tuple, seed: int, compile_: bool = False):
    """One forward+backward of the model ``build()`` makes, on the device and on the CPU
    from the same weights and input: (normwise errors by tensor, the session's route delta)."""
    import torch
    from collections import Counter
    session = s.torch()
    torch.manual_seed(seed)
    ref = build()
    dev = build()
    dev.load_state_dict(ref.state_dict())
    dev.to("fornax")
    x = torch.randn(*shape)
    target = torch.randn(shape[0], ref.out_features)
    xc = x.clone().requires_grad_()
    xd = x.to("fornax").requires_grad_()
    before = Counter(session.stats.routes)
    model = torch.compile(dev, backend="fornax") if compile_ else dev
    out_d = model(xd)
    loss_d = torch.nn.functional.mse_loss(out_d, target.to("fornax"))
    loss_d.backward()
    out_c = ref(xc)
    loss_c = torch.nn.functional.mse_loss(out_c, target)
    loss_c.backward()
    routes = Counter(session.stats.routes)
    routes.subtract(before)
    pairs = {"output": (out_d, out_c), "loss": (loss_d, loss_c), "input grad": (xd.grad, xc.grad)}
    for (name, pd), (_, pc) in zip(dev.named_parameters(), ref.named_parameters()):
        if pd.grad is None:
            raise AssertionError(f"no gradient reached {name} on the device")
        if pd.grad.device.type != "fornax":
            raise AssertionError(f"the gradient of {name} is on {pd.grad.device}, not on fornax")
        pairs[f"{name} grad"] = (pd.grad, pc.grad)
    if out_d.device.type != "fornax":
        raise AssertionError(f"the output is on {out_d.device}, not on fornax")
    return pairs, +routes


def _autograd(s: Subject, build, shape, seed) -> Outcome:
    pairs, routes = _train_step(s, build, shape, seed)
    err, worst = _worst(pairs)
    fallbacks = sorted({op for op, kind in routes if kind == "fallback"})
    native = sum(n for (op, kind), n in routes.items() if kind == "native")
    detail = (f"{len(pairs)} tensors (output, loss, input and {len(pairs) - 3} parameter grads); "
              f"worst {worst} {_fmt(err)}; {native} native kernel calls"
              + (f"; CPU fallbacks: {', '.join(fallbacks)}" if fallbacks else "; no CPU fallback"))
    return Outcome(err, err <= TOL["float32"], detail)


@check("L3", "mlp", "MLP (Linear-GELU-Linear) forward and backward on the device match CPU eager",
       seam="framework", measured="worst normwise error of output, loss and grads vs CPU",
       relation="<=", limit=TOL["float32"], dtype="float32", shape="x [4, 16] -> 32 -> 8")
def _l3_mlp(s: Subject) -> Outcome:
    return _autograd(s, _mlp, (4, 16), s.config.seed + 30)


@check("L3", "cnn", "CNN (Conv2d-ReLU-MaxPool-Linear) forward and backward on the device match "
       "CPU eager", seam="framework",
       measured="worst normwise error of output, loss and grads vs CPU", relation="<=",
       limit=TOL["float32"], dtype="float32", shape="x [2, 3, 8, 8], conv 3->4 k3 p1, pool 2, linear 64->5")
def _l3_cnn(s: Subject) -> Outcome:
    return _autograd(s, _cnn, (2, 3, 8, 8), s.config.seed + 31)


# ---------------------------------------------------------------------------------------------
# L4 compile
@check("L4", "torch_compile", "torch.compile(model, backend='fornax') forward+backward matches "
       "eager CPU", seam="compiler", measured="worst normwise error of output, loss and grads vs CPU",
       relation="<=", limit=TOL["float32"], dtype="float32", shape="MLP x [4, 16] -> 32 -> 8")
def _l4_torch_compile(s: Subject) -> Outcome:
    pairs, routes = _train_step(s, _mlp, (4, 16), s.config.seed + 40, compile_=True)
    err, worst = _worst(pairs)
    runs = {op: n for (op, kind), n in routes.items() if op.startswith("graph run:")}
    native_runs = sum(n for (op, kind), n in routes.items()
                      if op.startswith("graph run:") and kind == "native")
    refused = [op.removeprefix("graph run:") for (op, kind) in routes
               if op.startswith("graph run:") and kind == "fallback"]
    problems = []
    if native_runs < 2:
        problems.append(f"{native_runs} compiled graph run(s) on the device (want the forward and "
                        "the backward graph)" + (f"; refused: {', '.join(refused)}" if refused else ""))
    if err > TOL["float32"]:
        problems.append(f"worst {worst} {_fmt(err)}")
    detail = (f"{native_runs} compiled graph runs on the device ({', '.join(sorted(runs))}); "
              f"worst {worst} {_fmt(err)}")
    return Outcome(err, not problems, "; ".join(problems) or detail)


@check("L4", "jax_jit", "fornax.frameworks.jax.jit of an MLP's loss and gradient matches jax.jit",
       seam="compiler", measured="worst normwise error of loss and grads vs jax.jit (CPU)",
       relation="<=", limit=TOL["float32"], dtype="float32", shape="x [5, 8] -> 16 (tanh) -> 4")
def _l4_jax_jit(s: Subject) -> Outcome:
    import jax
    import jax.numpy as jnp

    from .frameworks.jax import jit, resolve
    rng = np.random.default_rng(s.config.seed + 41)
    params = {"w1": rng.standard_normal((8, 16)).astype(np.float32) / 3,
              "b1": rng.standard_normal(16).astype(np.float32),
              "w2": rng.standard_normal((16, 4)).astype(np.float32) / 4}
    x = rng.standard_normal((5, 8)).astype(np.float32)

    def loss(p, x):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"]) ** 2)

    step = jax.value_and_grad(loss)
    client = resolve(s.stack)
    before = dict(client.routes)
    got = jit(step, stack=s.stack)(params, x)
    want = jax.jit(step)(params, x)
    routes = {k: n - before.get(k, 0) for k, n in client.routes.items() if n != before.get(k, 0)}
    pairs = {"loss": (np.asarray(got[0]), np.asarray(want[0]))}
    for k in params:
        pairs[f"d{k}"] = (np.asarray(got[1][k]), np.asarray(want[1][k]))
    err, worst = _worst(pairs)
    native = sum(n for (_, route), n in routes.items() if route == "native")
    host = sorted({prim for (prim, route) in routes if route == "fallback"})
    problems = []
    if native == 0:
        problems.append("no equation ran on the device")
    if err > TOL["float32"]:
        problems.append(f"worst {worst} {_fmt(err)}")
    detail = (f"{native} equations lowered to the device"
              + (f", host fallbacks: {', '.join(host)}" if host else ", no host fallback")
              + f"; worst {worst} {_fmt(err)}")
    return Outcome(err, not problems, "; ".join(problems) or detail)


# ---------------------------------------------------------------------------------------------
# L5 numerics and autocast
@check("L5", "float32", "float32 matmul, softmax and layer_norm are within float32 tolerance of "
       "float64 references", seam="library", measured="worst normwise error vs float64",
       relation="<=", limit=TOL["float32"], dtype="float32",
       shape="matmul [16, 64] @ [64, 16]; softmax [8, 33]; layer_norm [8, 32]")
def _l5_float32(s: Subject) -> Outcome:
    import torch
    s.torch()
    g = torch.Generator().manual_seed(s.config.seed + 50)
    a, b = torch.randn(16, 64, generator=g), torch.randn(64, 16, generator=g)
    z = torch.randn(8, 33, generator=g) * 4
    y = torch.randn(8, 32, generator=g) * 3 + 1
    w, bias = torch.randn(32, generator=g), torch.randn(32, generator=g)
    a64, b64, z64, y64 = (t.double().numpy() for t in (a, b, z, y))
    e = np.exp(z64 - z64.max(-1, keepdims=True))
    mu, var = y64.mean(-1, keepdims=True), y64.var(-1, keepdims=True)
    ln = (y64 - mu) / np.sqrt(var + 1e-5) * w.double().numpy() + bias.double().numpy()
    D = "fornax"
    pairs = {
        "matmul": (a.to(D) @ b.to(D), a64 @ b64),
        "softmax": (torch.softmax(z.to(D), -1), e / e.sum(-1, keepdims=True)),
        "layer_norm": (torch.nn.functional.layer_norm(y.to(D), (32,), w.to(D), bias.to(D)), ln),
    }
    for name, (got, _) in pairs.items():
        if got.dtype != torch.float32:
            raise AssertionError(f"{name} returned {got.dtype}, not float32")
    errs = {n: normwise(_np(got), ref) for n, (got, ref) in pairs.items()}
    worst = max(errs, key=errs.get)
    return Outcome(errs[worst], errs[worst] <= TOL["float32"],
                   ", ".join(f"{n} {_fmt(v)}" for n, v in errs.items()))


@check("L5", "autocast", "torch.autocast('fornax') runs a matmul in the family's policy dtype, "
       "within that dtype's tolerance", seam="framework",
       measured="normwise error vs float64 of the dtype-rounded inputs", relation="<=",
       limit="float16 9.8e-04 / bfloat16 7.8e-03", dtype="float32 in, policy dtype out",
       shape="[16, 64] @ [64, 16]")
def _l5_autocast(s: Subject) -> Outcome:
    import torch
    session = s.torch()
    policy = session.framework.autocast_policy()
    lowered = policy.cast("aten::mm") == "lower_precision_fp"
    want = policy.default_dtype if lowered else "float32"
    g = torch.Generator().manual_seed(s.config.seed + 51)
    a, b = torch.randn(16, 64, generator=g), torch.randn(64, 16, generator=g)
    with torch.autocast("fornax"):
        mm = a.to("fornax") @ b.to("fornax")
    got = str(mm.dtype).removeprefix("torch.")
    problems = []
    if torch.get_autocast_dtype("fornax") != getattr(torch, policy.default_dtype):
        problems.append(f"torch.get_autocast_dtype('fornax') is {torch.get_autocast_dtype('fornax')}, "
                        f"the family's policy says {policy.default_dtype}")
    if got != want:
        problems.append(f"the matmul ran in {got}; the family's policy "
                        f"({policy.dispatch_key}: mm -> {policy.cast('aten::mm')}) says {want}")
    dt = getattr(torch, got)
    ref = a.to(dt).double().numpy() @ b.to(dt).double().numpy()
    err = normwise(_np(mm), ref)
    limit = TOL.get(got, TOL["float32"])
    if err > limit:
        problems.append(f"normwise error {_fmt(err)} exceeds the {got} limit {_fmt(limit)}")
    detail = (f"policy {policy.dispatch_key}: mm -> {policy.cast('aten::mm')}, default dtype "
              f"{policy.default_dtype}; the matmul ran in {got}; error {_fmt(err)} (limit {_fmt(limit)})")
    return Outcome(err, not problems, "; ".join(problems) or detail)


@check("L5", "bfloat16", "a bfloat16 matmul is within bfloat16 tolerance of float64",
       seam="library", measured="normwise error vs float64 of the bfloat16 inputs", relation="<=",
       limit=TOL["bfloat16"], dtype="bfloat16", shape="[16, 64] @ [64, 16]")
def _l5_bfloat16(s: Subject) -> Outcome:
    import torch
    s.torch()
    g = torch.Generator().manual_seed(s.config.seed + 52)
    a = torch.randn(16, 64, generator=g).bfloat16()
    b = torch.randn(64, 16, generator=g).bfloat16()
    out = a.to("fornax") @ b.to("fornax")
    if out.dtype != torch.bfloat16:
        raise AssertionError(f"a bfloat16 matmul returned {out.dtype}")
    err = normwise(_np(out), a.double().numpy() @ b.double().numpy())
    return Outcome(err, err <= TOL["bfloat16"], f"normwise error {_fmt(err)} "
                   f"(one bfloat16 rounding is <= {2.0 ** -8:.1e})")


# ---------------------------------------------------------------------------------------------
# L6 distributed
@dataclass
class _Built(Outcome):
    """An outcome measured on another stack than the subject's (its build line differs)."""

    build: str = ""


@check("L6", "all_reduce", "the library's all-reduce across two devices gives the sum",
       seam="library", measured="elements differing from numpy's sum", relation="==", limit=0,
       dtype="float32", shape="[301] per rank, 2 ranks")
def _l6_all_reduce(s: Subject) -> Outcome:
    stack = compose(s.derived(devices=2))
    comm = stack.communicator()
    rng = np.random.default_rng(s.config.seed + 60)
    count = 301                       # odd: the ring's chunks are uneven
    ints = [rng.integers(-1000, 1000, count).astype(np.float32) for _ in range(2)]
    reals = [rng.standard_normal(count).astype(np.float32) for _ in range(2)]
    # integer-valued floats sum exactly in any order; two float32 addends round the same
    # way in any order, so both are exact against numpy
    cases = {"integer-valued": (ints, ints[0] + ints[1]), "random": (reals, reals[0] + reals[1])}
    differ, parts = 0, []
    for name, (xs, want) in cases.items():
        send, recv = [], []
        for r in range(2):
            p = comm.malloc(r, count * 4)
            comm.upload(r, p, xs[r])
            send.append(p)
            recv.append(comm.malloc(r, count * 4))
        works = [comm.rank(r).all_reduce(send[r], recv[r], count, "float32", "sum") for r in range(2)]
        for w in works:
            w.wait()
        for r in range(2):
            got = comm.download(r, recv[r], count, "float32")
            n = int(np.sum(got.view(np.int32) != want.view(np.int32)))
            differ += n
            if n:
                parts.append(f"{name} data: rank {r} has {n} elements that are not the sum")
    detail = (f"{comm.name} over {comm.size} ranks ({stack.config.topology} fabric): every rank "
              "holds the exact sum, integer-valued and random data")
    return _Built(differ, differ == 0, "; ".join(parts) or detail, build=s.build(stack))


@check("L6", "dist_backend", "the framework face names the distributed backend, one PyTorch "
       "knows, and torch.fornax reports the same", seam="framework",
       measured="torch.distributed backend name", relation="==",
       limit="a name in torch.distributed.Backend.backend_list")
def _l6_dist_backend(s: Subject) -> Outcome:
    import torch
    import torch.distributed as dist
    s.torch()
    name = s.stack.framework.face.dist_backend
    shown = torch.fornax.face()["dist_backend"]
    known = list(dist.Backend.backend_list) if dist.is_available() else []
    problems = []
    if not name:
        problems.append("the face names no distributed backend")
    elif name not in known:
        problems.append(f"{name!r} is not a backend PyTorch knows ({', '.join(known)})")
    if shown != name:
        problems.append(f"torch.fornax.face() says {shown!r}, the framework seam {name!r}")
    return Outcome(name, not problems, "; ".join(problems) or
                   f"torch.distributed.init_process_group(backend={name!r}) on the "
                   f"{s.stack.framework.face.device_type!r} device type")


# ---------------------------------------------------------------------------------------------
# L7 failure handling and diagnosability
def _family_code(stack: Stack, exc: FornaxError) -> str | None:
    """Why ``exc`` does not carry its family's vendor code and a hint (None: it does)."""
    if exc.code is None:
        return "the error carries no vendor code"
    seam = exc.seam
    if seam not in stack.config.seams:
        return f"the error names no seam (seam = {seam!r})"
    if exc.vendor != stack.config.seams[seam]:
        return f"the error names vendor {exc.vendor!r}, the {seam} seam is {stack.config.seams[seam]!r}"
    table = getattr(stack.seam(seam), "errors", None)
    if table is None or exc.code.api != table.api or exc.code.name not in table.codes:
        return f"{exc.code} is not a code of the {seam} seam's error table"
    if not exc.hint:
        return "the error has no hint (what to do)"
    return None


def _still_works(s: Subject) -> str | None:
    """Why the stack under test does not compute after a failure (None: it does)."""
    import torch
    s.torch()
    g = torch.Generator().manual_seed(s.config.seed + 70)
    x = torch.randn(4, 8, generator=g)
    got = (x.to("fornax") * 2 + 1).cpu()
    return None if torch.equal(got, x * 2 + 1) else "x * 2 + 1 on the device differs from CPU"


@check("L7", "fault", "an injected uncorrectable ECC error gives an error with the family's "
       "vendor code and a hint; the process keeps working", seam="driver",
       measured="vendor code of the error", relation="==", limit="a code of the family's table",
       dtype="float32", shape="[4, 8]")
def _l7_fault(s: Subject) -> Outcome:
    import torch
    faulty = compose(s.config)
    faulty.devices[0].inject(FaultPlan((FaultSpec("ecc_uncorrectable", at=1),), seed=s.config.seed))
    s.torch(faulty)
    x = torch.ones(4, 8).to("fornax")
    error = None
    try:
        (x * 2).cpu()
    except FornaxError as exc:
        error = exc
    finally:
        del x
    problems = []
    if error is None:
        problems.append("the injected fault raised no error: the result was silently used")
    else:
        why = _family_code(faulty, error)
        if why:
            problems.append(why)
        if "\n" in str(error):
            problems.append("the message spans several lines")
    broken = _still_works(s)
    if broken:
        problems.append(f"afterwards, on a fresh context: {broken}")
    msg = " ".join(str(error).split()) if error is not None else ""
    return _Built(str(error.code) if error is not None and error.code else None, not problems,
                  "; ".join(problems) or f"{type(error).__name__}: {msg}; the stack under test "
                  "computes correctly afterwards", build=s.build(faulty))


@check("L7", "oom", "an allocation beyond device memory gives an out-of-memory error with the "
       "family's vendor code and a hint; the stack keeps working", seam="runtime",
       measured="vendor code of the error", relation="==", limit="a code of the family's table",
       dtype="uint8", shape="[2 x device memory]")
def _l7_oom(s: Subject) -> Outcome:
    import torch
    s.torch()
    total = torch.fornax.get_device_properties().total_memory
    before = torch.fornax.memory_allocated()
    error = None
    try:
        torch.empty(2 * total, dtype=torch.uint8, device="fornax")
    except FornaxError as exc:
        error = exc
    problems = []
    if error is None:
        problems.append(f"allocating {2 * total} bytes on a {total}-byte device raised no error")
    else:
        if error.kind != "out_of_memory":
            problems.append(f"the error is a {error.kind!r} error, not out_of_memory")
        why = _family_code(s.stack, error)
        if why:
            problems.append(why)
    if torch.fornax.memory_allocated() != before:
        problems.append(f"memory_allocated moved from {before} to {torch.fornax.memory_allocated()} "
                        "after the failed allocation")
    broken = _still_works(s)
    if broken:
        problems.append(f"afterwards: {broken}")
    msg = " ".join(str(error).split()) if error is not None else ""
    return Outcome(str(error.code) if error is not None and error.code else None, not problems,
                   "; ".join(problems) or f"{type(error).__name__}: {msg[:240]}; the stack keeps "
                   "computing")


@check("L7", "bad_config", "a bad stack config (an unknown key, a misspelt vendor) is a one-line "
       "error naming what is wrong", seam=None, measured="one-line config errors",
       relation="==", limit=2)
def _l7_bad_config(s: Subject) -> Outcome:
    cfg = s.config
    seams = "\n".join(f'{k} = "{v}"' for k, v in cfg.seams.items())
    misspelt = f"{cfg.seams['compiler']}x"
    cases = {
        "unknown key": (f'[stack]\nspec = "{cfg.spec}"\ndevicez = 2\n[stack.seams]\n{seams}\n', "devicez"),
        "misspelt vendor": (f'[stack]\nspec = "{cfg.spec}"\n[stack.seams]\n'
                            + seams.replace(f'compiler = "{cfg.seams["compiler"]}"',
                                            f'compiler = "{misspelt}"') + "\n", misspelt),
    }
    good, problems, lines = 0, [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (text, culprit) in cases.items():
            path = Path(tmp) / f"{name.replace(' ', '_')}.toml"
            path.write_text(text, encoding="utf-8")
            try:
                load_config(path)
            except ConfigError as exc:
                msg = str(exc)
                if "\n" in msg:
                    problems.append(f"{name}: the message spans {msg.count(chr(10)) + 1} lines")
                elif culprit not in msg:
                    problems.append(f"{name}: the message does not name {culprit!r}: {msg}")
                else:
                    good += 1
                    lines.append(msg.replace(str(path), path.name))
            else:
                problems.append(f"{name}: the config was accepted")
    return Outcome(good, good == len(cases), "; ".join(problems) or " | ".join(lines))


# the evidence from real clients (packaging, profiling, PyTorch's databases, real models)
from . import qualify_clients  # noqa: E402,F401
