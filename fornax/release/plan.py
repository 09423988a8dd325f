"""The regression matrix: which runs a baseline holds, and how far each metric may move.

A matrix is TOML data (never executed), read by :func:`load`::

    [matrix]
    vendors = ["cuda-like", "rocm-like", "xpu-like"]   # families: every seam from one
    frameworks = ["graph"]                             # front ends: graph, torch, jax
    workloads = ["mlp"]                                # see `fornax workloads`
    specs = ["h200-like"]                              # see `fornax specs`
    seed = 0                                           # optional (default 0)

    [stack]                                            # optional: every run's stack switches
    fuse = true                                        # fuse, replay, translate

    [tolerances]                                       # optional: per metric
    device_time_s = { relative = 0.001 }
    max_abs_err = { relative = 0.5, absolute = 1e-6 }

The runs are the cross product ``vendors x frameworks x workloads x specs``; every name is
checked before anything runs (a :class:`~fornax.layers.errors.ConfigError` names the first
mistake).  A change of a metric is within tolerance when ``|new - old| <= max(absolute,
relative * |old|)``; a metric no tolerance names must not move at all.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..compare import FRAMEWORKS, resolve_workload
from ..layers.errors import ConfigError
from ..sim import tomlfile
from ..sim.spec import available_specs
from ..stack import StackConfig, make_config, runnable_vendors
from .metrics import EXACT, METRICS, Tolerance, known_metric

#: the matrix that ships with fornax (``fornax baseline save`` without ``--matrix``)
DEFAULT_MATRIX = "default_matrix.toml"
#: the lists of ``[matrix]``, in the order a run's key names them
AXES = ("frameworks", "workloads", "vendors", "specs")
#: the stack switches ``[stack]`` may set on every run (``StackConfig`` fields)
STACK_SWITCHES = ("fuse", "replay", "translate")
_TOLERANCE_KEYS = ("relative", "absolute")




@dataclass(frozen=True)
class Run:
    """One run of the matrix: a workload of a front end on a family's stack and a chip."""

    framework: str
    workload: str
    vendor: str
    spec: str

    @property
    def key(self) -> str:
        return f"{self.framework}/{self.workload}/{self.vendor}/{self.spec}"

    def to_json(self) -> dict[str, str]:
        return {"key": self.key, "framework": self.framework, "workload": self.workload,
                "vendor": self.vendor, "spec": self.spec}


@dataclass(frozen=True)
class Matrix:
    """The runs of a baseline and the tolerances its metrics are held to."""

    frameworks: tuple[str, ...]
    workloads: tuple[str, ...]
    vendors: tuple[str, ...]
    specs: tuple[str, ...]
    seed: int = 0
    stack: dict[str, bool] = field(default_factory=dict)
    tolerances: dict[str, Tolerance] = field(default_factory=dict)
    source: str = DEFAULT_MATRIX

    def runs(self) -> list[Run]:
        return [Run(fw, wl, v, s) for fw in self.frameworks for wl in self.workloads
                for v in self.vendors for s in self.specs]

    def config(self, run: Run) -> StackConfig:
        """The stack config of one run: the family on every seam, the chip, the seed and the
        ``[stack]`` switches."""
        return make_config(run.vendor, spec=run.spec, seed=self.seed, fuse=self.stack.get("fuse"),
                           replay=self.stack.get("replay"), translate=self.stack.get("translate"))

    def tolerance(self, metric: str) -> Tolerance:
        """The tolerance of ``metric``: its own entry, else its family's (``max_abs_err`` for
        ``max_abs_err[y]``, ``bench`` for ``bench.NAME``), else exact."""
        family = "bench" if metric.startswith("bench.") else metric.split("[", 1)[0]
        return self.tolerances.get(metric) or self.tolerances.get(family) or EXACT

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "frameworks": list(self.frameworks),
                "workloads": list(self.workloads), "vendors": list(self.vendors),
                "specs": list(self.specs), "seed": self.seed, "stack": dict(self.stack),
                "tolerances": {k: t.to_json() for k, t in sorted(self.tolerances.items())}}


def load(path: str | Path | None = None) -> Matrix:
    """The matrix in TOML file ``path`` (None: the one fornax ships), every name checked."""
    if path is None:
        text = (resources.files(__package__) / DEFAULT_MATRIX).read_text(encoding="utf-8")
        return parse(tomllib.loads(text), DEFAULT_MATRIX)
    return parse(tomlfile.read(path, "matrix file", ConfigError), str(path))


def from_json(doc: dict[str, Any]) -> Matrix:
    """The matrix a stored baseline recorded (:meth:`Matrix.to_json`), checked again."""
    data = {"matrix": {k: doc[k] for k in (*AXES, "seed") if k in doc},
            "stack": doc.get("stack", {}), "tolerances": doc.get("tolerances", {})}
    return parse(data, str(doc.get("source", "baseline")))


def parse(data: dict[str, Any], where: str) -> Matrix:
    """A matrix from TOML data (``where`` names its file in messages)."""
    unknown = sorted(set(data) - {"matrix", "stack", "tolerances"})
    if unknown:
        raise ConfigError(f"matrix file {where}: unknown table(s) {', '.join(unknown)}",
                          hint="a matrix has [matrix], [stack] and [tolerances]")
    body = data.get("matrix")
    if not isinstance(body, dict):
        raise ConfigError(f"matrix file {where} has no [matrix] table",
                          hint='e.g. [matrix] vendors = ["cuda-like"], frameworks = ["graph"], '
                               'workloads = ["mlp"], specs = ["h200-like"]')
    extra = sorted(set(body) - {*AXES, "seed"})
    if extra:
        raise ConfigError(f"matrix file {where}: unknown key(s) {', '.join(extra)} in [matrix]; "
                          f"known keys: {', '.join((*AXES, 'seed'))}")
    known = {"frameworks": list(FRAMEWORKS), "vendors": runnable_vendors(), "specs": available_specs()}
    axes = {axis: _names(body, axis, where, known.get(axis)) for axis in AXES}
    for fw in axes["frameworks"]:
        for wl in axes["workloads"]:
            try:
                resolve_workload(fw, wl)
            except ConfigError as exc:
                raise ConfigError(f"matrix file {where}: workload {wl!r} of front end {fw}: "
                                  f"{exc.message}", hint=exc.hint or "see `fornax workloads`") from None
    seed = body.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"matrix file {where}: seed must be a whole number >= 0, got {seed!r}")
    return Matrix(frameworks=axes["frameworks"], workloads=axes["workloads"], vendors=axes["vendors"],
                  specs=axes["specs"], seed=seed, stack=_switches(data.get("stack", {}), where),
                  tolerances=_tolerances(data.get("tolerances", {}), where), source=where)


def _names(body: dict[str, Any], axis: str, where: str, known: list[str] | None) -> tuple[str, ...]:
    value = body.get(axis)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"matrix file {where}: [matrix] {axis} must be a non-empty list of names, "
                          f"got {value!r}", hint=f'e.g. {axis} = ["{(known or ["mlp"])[0]}"]')
    dup = sorted({v for v in value if value.count(v) > 1})
    if dup:
        raise ConfigError(f"matrix file {where}: [matrix] {axis} names {', '.join(dup)} more than once")
    for v in value:
        if known is not None and v not in known:
            raise ConfigError(f"matrix file {where}: unknown {axis.rstrip('s')} {v!r} in [matrix] {axis}; "
                              f"available: {', '.join(known)}")
    return tuple(value)


def _switches(table: object, where: str) -> dict[str, bool]:
    if not isinstance(table, dict):
        raise ConfigError(f"matrix file {where}: [stack] must be a table of switches")
    for key, value in table.items():
        if key not in STACK_SWITCHES:
            raise ConfigError(f"matrix file {where}: unknown key {key!r} in [stack]; "
                              f"known keys: {', '.join(STACK_SWITCHES)}")
        if not isinstance(value, bool):
            raise ConfigError(f"matrix file {where}: [stack] {key} must be true or false, got {value!r}")
    return dict(table)


def _tolerances(table: object, where: str) -> dict[str, Tolerance]:
    if not isinstance(table, dict):
        raise ConfigError(f"matrix file {where}: [tolerances] must be a table of METRIC = "
                          "{ relative = R, absolute = A }")
    out: dict[str, Tolerance] = {}
    for metric, entry in table.items():
        if not known_metric(metric):
            raise ConfigError(f"matrix file {where}: [tolerances] names unknown metric {metric!r}",
                              hint=f"metrics: {', '.join(m.key for m in METRICS)}, "
                                   "max_abs_err[OUTPUT], bench, bench.FIGURE")
        if not isinstance(entry, dict) or not entry or set(entry) - set(_TOLERANCE_KEYS):
            raise ConfigError(f"matrix file {where}: [tolerances] {metric} must be a table with "
                              f"relative and/or absolute, got {entry!r}",
                              hint=f"e.g. {metric} = {{ relative = 0.01 }}")
        values: dict[str, float] = {}
        for k, v in entry.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"matrix file {where}: [tolerances] {metric}.{k} must be a "
                                  f"finite number >= 0, got {v!r}")
            values[k] = float(v)
        out[metric] = Tolerance(**values)
    return out
