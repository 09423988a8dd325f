"""Which OpInfos, ModuleInfos and OptimInfos a run takes, and how many samples of each.

The suite's test modules read their selection from the environment, so that a run in a
subprocess (:func:`fornax.contracts.torch_suite.run_suite`) and a plain ``pytest --pyargs``
call agree:

``FORNAX_TORCH_SUITE_MODE``
    ``sample`` (default): a fixed, deterministic slice: the entries whose CRC-32 of the
    name falls in the slice, and the first :data:`SAMPLE_LIMIT` samples of each check (all
    of them for a check that a known-failure entry covers, so staleness is judged on the
    same samples as the full run); ``full``: everything.
``FORNAX_TORCH_SUITE_ONLY``
    comma-separated names (OpInfo full names, ModuleInfo or OptimInfo names): only these,
    in either mode.
``FORNAX_TORCH_SUITE_DTYPES``
    comma-separated OpInfo dtypes (of :data:`DTYPES`): only these.
``FORNAX_TORCH_SUITE_SHARD``
    ``i/n``: only the entries at positions ``i, i+n, i+2n...`` of the (sorted) selection.
"""

from __future__ import annotations

import os
import zlib

from ...layers.errors import ConfigError

MODE = "FORNAX_TORCH_SUITE_MODE"
ONLY = "FORNAX_TORCH_SUITE_ONLY"
SHARD = "FORNAX_TORCH_SUITE_SHARD"
KNOWN = "FORNAX_TORCH_SUITE_KNOWN"
EVENTS = "FORNAX_TORCH_SUITE_EVENTS"
ONLY_DTYPES = "FORNAX_TORCH_SUITE_DTYPES"

#: sampled mode: 1 entry in SLICE[kind] (by CRC-32 of its name), SAMPLE_LIMIT samples per check
SLICE = {"ops": 40, "modules": 20, "optims": 3}
SAMPLE_LIMIT = 2

#: the dtypes the suite runs OpInfos in (where CPU supports them)
DTYPES = ("float32", "float16", "bfloat16", "int64", "bool", "complex64")


def mode() -> str:
    value = os.environ.get(MODE, "sample")
    if value not in ("sample", "full"):
        raise ConfigError(f"{MODE}={value!r}: expected 'sample' or 'full'")
    return value


def dtypes() -> tuple[str, ...]:
    wanted = [d.strip() for d in os.environ.get(ONLY_DTYPES, "").split(",") if d.strip()]
    bad = [d for d in wanted if d not in DTYPES]
    if bad:
        raise ConfigError(f"{ONLY_DTYPES}: not a suite dtype: {', '.join(bad)}", hint=f"dtypes: {', '.join(DTYPES)}")
    return tuple(wanted) or DTYPES


def only() -> set[str]:
    return {n.strip() for n in os.environ.get(ONLY, "").split(",") if n.strip()}


def shard() -> tuple[int, int]:
    value = os.environ.get(SHARD, "0/1")
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise ConfigError(f"{SHARD}={value!r}: expected i/n, e.g. 0/4") from None
    if n < 1 or not 0 <= i < n:
        raise ConfigError(f"{SHARD}={value!r}: need 0 <= i < n")
    return i, n


def in_slice(kind: str, name: str) -> bool:
    return zlib.crc32(name.encode()) % SLICE[kind] == 0


def select(kind: str, items, name_of) -> list:
    """The entries of ``items`` (a PyTorch database) this run takes, in name order."""
    wanted = only()
    sampled = mode() == "sample"
    chosen = sorted((x for x in items
                     if (name_of(x) in wanted if wanted else (not sampled or in_slice(kind, name_of(x))))),
                    key=name_of)
    i, n = shard()
    return chosen[i::n]


def sample_limit(covered_by_known: bool) -> int | None:
    """How many samples a check takes (None: all)."""
    if mode() == "full" or covered_by_known or only():
        return None
    return SAMPLE_LIMIT
