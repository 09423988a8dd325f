"""Machine-readable benchmark results: every figure a run measures, collected into ``bench.json``.

Each benchmark module declares the figures it can produce, as name patterns whose ``{word}``
parts stand for one family, size, program, ... (:class:`Figures`; ``choices`` limits a part to
the values listed), and records each figure it measures through that declaration::

    FIGURES = Figures("torch.eager_add_us[{device}]", choices={"device": ("torch CPU eager", *FAMILIES)})
    FIGURES.record("torch.eager_add_us[cuda-like]", 21.4, "us", target=ADD_TARGET_US)

A name no pattern of the module matches is refused, so the declared patterns are every name a
run can write (``known(name)``: the README's summary may only quote such names).  Records go
to the active :class:`Collector` (``with collecting() as c:``); outside one they are checked and
dropped, so ``python -m benchmarks.torch_frontend`` still just prints its tables.

The document (``to_doc``) is ``benchmarks.bench/1``, checked against ``bench.schema.json``
beside this module (:func:`validate`)::

    {"schema": "benchmarks.bench/1",
     "meta": {"date": ..., "python": ..., "versions": {...}, "cpu_count": 2, ...},
     "figures": [{"name": ..., "module": ..., "value": 21.4, "unit": "us",
                  "target": 30.0, "kind": "max", "met": true}, ...]}

``kind`` says which side of the target is good: ``max`` — the value may be at most the target;
``min`` — at least.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import re
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

SCHEMA_ID = "benchmarks.bench/1"
SCHEMA_PATH = Path(__file__).with_name("bench.schema.json")
#: where ``python -m benchmarks`` writes unless --json or this variable says otherwise
JSON_ENV = "FORNAX_BENCH_JSON"
DEFAULT_JSON = "bench.json"
#: the units a figure may carry (``us`` = microseconds; ``x`` = a ratio; ``fraction`` in [0, 1];
#: ``bool`` = 1 for yes, 0 for no)
UNITS = ("s", "us", "x", "bytes", "fraction", "count", "bool", "TFLOP/s", "TB/s", "GB/s")
KINDS = ("max", "min")
#: the distributions whose versions the run metadata names
VERSIONS = ("fornax", "torch", "jax", "jaxlib", "numpy", "transformers")

_PLACEHOLDER = re.compile(r"\\\{(\w+)\\\}")


def _regex(pattern: str, choices: dict[str, tuple[str, ...]]) -> re.Pattern[str]:
    """``{word}`` stands for one of ``choices[word]`` where given, else for one non-empty part
    without brackets; everything else is literal."""
    def part(m: re.Match[str]) -> str:
        if m.group(1) in choices:
            return "(?:" + "|".join(re.escape(c) for c in choices[m.group(1)]) + ")"
        return r"[^\[\]]+"
    return re.compile(_PLACEHOLDER.sub(part, re.escape(pattern)) + r"\Z")


class Figures:
    """The figures one benchmark module declares (name patterns), and its way to record them."""

    #: module name -> its declaration (every imported benchmark module's)
    registry: dict[str, Figures] = {}

    def __init__(self, *patterns: str, choices: dict[str, tuple[str, ...]] | None = None,
                 module: str | None = None) -> None:
        if module is None:                              # the declaring module's name
            module = sys._getframe(1).f_globals.get("__name__", "?")
        if module == "__main__":                        # python -m benchmarks.X: keep one key per module
            spec = sys.modules["__main__"].__spec__
            module = spec.name if spec is not None else module
        if not patterns:
            raise ValueError(f"{module} declares no figure")
        self.module = module
        self.patterns = tuple(patterns)
        self.choices = {k: tuple(v) for k, v in (choices or {}).items()}
        self._regexes = [_regex(p, self.choices) for p in patterns]
        Figures.registry[module] = self

    def matches(self, name: str) -> bool:
        return any(r.match(name) for r in self._regexes)

    def record(self, name: str, value: float, unit: str, target: float | None = None,
               kind: str = "max", note: str | None = None) -> dict[str, Any]:
        """Record one measured figure in the active collector (and return it)."""
        if not self.matches(name):
            raise ValueError(f"{self.module} records figure {name!r}, which none of its declared "
                             f"patterns matches: {', '.join(self.patterns)}")
        return current().add(figure(name, value, unit, target, kind, note, module=self.module))


def figure(name: str, value: float, unit: str, target: float | None = None, kind: str = "max",
           note: str | None = None, module: str = "?") -> dict[str, Any]:
    """One figure as its JSON object (``target``, ``kind`` and ``met`` only where it has a target)."""
    if unit not in UNITS:
        raise ValueError(f"figure {name!r}: unit {unit!r} is not one of {', '.join(UNITS)}")
    if kind not in KINDS:
        raise ValueError(f"figure {name!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"figure {name!r}: value {value} is not finite")
    out: dict[str, Any] = {"name": name, "module": module, "value": value, "unit": unit}
    if target is not None:
        target = float(target)
        out.update(target=target, kind=kind, met=bool(value <= target if kind == "max" else value >= target))
    if note:
        out["note"] = note
    return out


class Collector:
    """The figures of one run, in the order they were recorded; names are unique."""

    def __init__(self) -> None:
        self.figures: list[dict[str, Any]] = []
        self._names: set[str] = set()
        self.skipped: list[dict[str, str]] = []      # {"module", "reason"}: what did not run
        self.errors: list[dict[str, str]] = []       # {"module", "error"}: what raised

    def add(self, fig: dict[str, Any]) -> dict[str, Any]:
        if fig["name"] in self._names:
            raise ValueError(f"figure {fig['name']!r} recorded twice")
        self._names.add(fig["name"])
        self.figures.append(fig)
        return fig

    def record(self, name: str, value: float, unit: str, target: float | None = None,
               kind: str = "max", note: str | None = None, module: str = "?") -> dict[str, Any]:
        """Record a figure no module declaration vouches for (tests, one-off scripts)."""
        return self.add(figure(name, value, unit, target, kind, note, module))

    def skip(self, module: str, reason: str) -> None:
        self.skipped.append({"module": module, "reason": reason})

    def error(self, module: str, error: str) -> None:
        self.errors.append({"module": module, "error": error})

    def to_doc(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"schema": SCHEMA_ID, "meta": {**(meta if meta is not None else metadata_of_run()),
                                              "skipped": list(self.skipped), "errors": list(self.errors)},
                "figures": list(self.figures)}


_collectors: list[Collector] = []


def current() -> Collector:
    """The collector records go to now: the innermost ``collecting()`` block's, else a throwaway
    one (a benchmark run on its own checks its figures and prints its tables, and keeps nothing)."""
    return _collectors[-1] if _collectors else Collector()


@contextlib.contextmanager
def collecting(collector: Collector | None = None) -> Iterator[Collector]:
    """Route every record inside the block to ``collector`` (a fresh one by default)."""
    c = collector if collector is not None else Collector()
    _collectors.append(c)
    try:
        yield c
    finally:
        _collectors.remove(c)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _command() -> str:
    """The command line of this process, as typed (``python -m benchmarks ...`` for a module),
    after the ``FORNAX_BENCH_*`` variables that change what runs (``FORNAX_BENCH_COMBOS=1 ...``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = [f"-m {spec.name.removesuffix('.__main__')}"] if spec is not None else sys.argv[:1]
    env = [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("FORNAX_BENCH_") and k != JSON_ENV]
    return " ".join([*env, "python", *head, *sys.argv[1:]])


def _cpu() -> str:
    """The processor's model name and widest vector extension (the host BLAS picks its kernels
    by them, so ratios against the host move with them), from /proc/cpuinfo where there is one."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            info = fh.read(1 << 16)
    except OSError:
        return platform.processor() or platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), platform.machine())
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines()
                  if line.startswith("flags")), [])
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    return f"{model} ({isa})" if isa else model


def metadata_of_run(wall_s: float | None = None, modules: list[str] | None = None) -> dict[str, Any]:
    """Date (UTC, ISO 8601), Python and package versions, the machine's CPU count."""
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "versions": {d: _version(d) for d in VERSIONS},
        "cpu_count": os.cpu_count() or 1,
        "platform": platform.platform(),
        "cpu": _cpu(),
        "command": _command(),
    }
    if hasattr(os, "getloadavg"):                   # the machine is shared: how busy it was
        meta["load_average"] = [round(x, 2) for x in os.getloadavg()]
    if wall_s is not None:
        meta["wall_s"] = round(wall_s, 3)
    if modules is not None:
        meta["modules"] = list(modules)
    return meta


def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def validate(doc: dict[str, Any]) -> None:
    """Check ``doc`` against ``bench.schema.json`` (raises ``jsonschema.ValidationError``), and
    what a schema cannot say: names are unique, ``met`` agrees with value, target and kind."""
    import jsonschema

    jsonschema.validate(doc, schema(), format_checker=jsonschema.FormatChecker())
    seen: set[str] = set()
    for f in doc["figures"]:
        if f["name"] in seen:
            raise jsonschema.ValidationError(f"figure {f['name']!r} appears twice")
        seen.add(f["name"])
        if "target" in f:
            want = f["value"] <= f["target"] if f["kind"] == "max" else f["value"] >= f["target"]
            if f["met"] != want:
                raise jsonschema.ValidationError(f"figure {f['name']!r}: met is {f['met']}, "
                                                 f"but value {f['value']} {f['kind']} {f['target']}")


def write(doc: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Validate ``doc`` and write it to ``path`` (the parent folder is made)."""
    validate(doc)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def json_path(cli: str | None = None) -> Path:
    """``--json PATH``, else ``$FORNAX_BENCH_JSON``, else ``./bench.json`` (the working directory)."""
    return Path(cli or os.environ.get(JSON_ENV) or DEFAULT_JSON)


def known_patterns() -> dict[str, tuple[str, ...]]:
    """Every benchmark module's declared name patterns (imports them all; nothing runs)."""
    import importlib

    importlib.import_module("benchmarks.__main__")     # imports every module it runs
    return {m: f.patterns for m, f in sorted(Figures.registry.items())}


def known(name: str) -> bool:
    """Whether some benchmark module can produce a figure called ``name``."""
    known_patterns()
    return any(f.matches(name) for f in Figures.registry.values())
