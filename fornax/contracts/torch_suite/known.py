"""A family's known-failure table: data, validated, matched, and checked for staleness.

``known_failures/<family>.toml`` lists what PyTorch's OpInfo, ModuleInfo and OptimInfo
checks find different on that family's fornax device::

    schema = "fornax.known-failures/1"
    family = "cuda-like"

    [[failure]]
    kind = "ops"                  # ops | modules | optims
    name = "nn.functional.conv3d" # OpInfo full name, ModuleInfo name or OptimInfo name
    dtype = "float32"             # or "*" (every dtype)
    variant = "forward"           # forward noncontiguous out inplace backward | to state_dict
                                  # deepcopy | step foreach fused | "*"
    reason = "what differs and why"
    atol = 1e-4                   # optional: a tolerance (below)
    rtol = 1e-5

An entry with ``atol`` / ``rtol`` is a *tolerance* entry, the fornax counterpart of PyTorch's
per-device ``toleranceOverride``: the check's samples may differ from the CPU's by up to
these (its reason says why: a different summation order, one rounding instead of two); a
sample beyond them fails the run as if no entry covered it.

The table is checked against ``fornax/schemas/known-failures.schema.json`` when it is
loaded; a malformed table is a :class:`ConfigError` naming the file and the entry.  A check
(one op, dtype and variant) covered by an entry is expected to fail: if every one of its
samples passes, the entry is *stale* and the run fails (strict, as IREE's conformance
tables are), so the table can only shrink as fornax gets better.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ...layers.errors import ConfigError
from ...sim import tomlfile
from ...stack import BUILTIN_FAMILIES

SCHEMA = "known-failures.schema.json"
FAMILIES = BUILTIN_FAMILIES


@dataclass(frozen=True)
class Entry:
    kind: str
    name: str
    dtype: str
    variant: str
    reason: str
    atol: float | None = None
    rtol: float | None = None

    @property
    def tolerance(self) -> dict | None:
        """``assert_close`` keyword arguments of a tolerance entry (the schema asks for both
        or neither), else None."""
        if self.atol is None or self.rtol is None:
            return None
        return {"atol": self.atol, "rtol": self.rtol}

    def covers(self, kind: str, name: str, dtype: str, variant: str) -> bool:
        return (self.kind == kind and self.name == name and self.dtype in ("*", dtype)
                and self.variant in ("*", variant))

    def key(self) -> str:
        return f"{self.kind}:{self.name}:{self.dtype}:{self.variant}"


def schema() -> dict:
    return json.loads(resources.files("fornax.schemas").joinpath(SCHEMA).read_text())


def default_path(family: str) -> Path:
    """The table the package ships for ``family``."""
    if family not in FAMILIES:
        raise ConfigError(f"no known-failure table for family {family!r}",
                          hint=f"families with a table: {', '.join(FAMILIES)}")
    return Path(str(resources.files("fornax.contracts").joinpath(
        "torch_suite", "known_failures", f"{family}.toml")))


def validate(data: dict, where: str) -> None:
    """Raise :class:`ConfigError` naming ``where`` and the offending entry unless ``data`` is a
    valid table."""
    import jsonschema
    errors = sorted(jsonschema.Draft202012Validator(schema()).iter_errors(data),
                    key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        at = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        raise ConfigError(f"{where}: invalid known-failure table at {at}: {e.message}",
                          hint="see fornax/schemas/known-failures.schema.json: each [[failure]] "
                               "needs kind, name, dtype, variant and a real reason")
    seen: dict[str, int] = {}
    for i, item in enumerate(data["failure"]):
        key = f"{item['kind']}:{item['name']}:{item['dtype']}:{item['variant']}"
        if key in seen:
            raise ConfigError(f"{where}: failure[{i}] repeats failure[{seen[key]}] ({key})",
                              hint="list each op, dtype and variant once")
        seen[key] = i


class KnownFailures:
    """The entries of one table, and which of them matched a failing check."""

    def __init__(self, family: str, entries: list[Entry], path: str = "<memory>"):
        self.family = family
        self.entries = entries
        self.path = path

    @classmethod
    def load(cls, path: str | Path) -> "KnownFailures":
        path = Path(path)
        data = tomlfile.read(path, "known-failure table", ConfigError)
        data.setdefault("failure", [])
        validate(data, str(path))
        return cls(data["family"], [Entry(**f) for f in data["failure"]], str(path))

    @classmethod
    def for_family(cls, family: str) -> "KnownFailures":
        return cls.load(default_path(family))

    def find(self, kind: str, name: str, dtype: str, variant: str) -> Entry | None:
        return next((e for e in self.entries if e.covers(kind, name, dtype, variant)), None)

    def names(self, kind: str) -> set[str]:
        return {e.name for e in self.entries if e.kind == kind}
