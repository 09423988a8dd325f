"""Run the torch suite on one family: pytest subprocesses, their events, a :class:`SuiteResult`.

A full run gives each kind its own ``python -m pytest --pyargs fornax.contracts.torch_suite.<kind>_suite``
subprocesses (OpInfos in several shards); the sample runs every kind asked for in one
subprocess (PyTorch's databases take several seconds to import, once).  Each has the family
in ``FORNAX_VENDOR``, the selection in the environment (:mod:`.selection`) and :mod:`.plugin`
loaded.  A subprocess bounds the memory a long run can grow to, and a crash of the
interpreter (or a hang past ``timeout``) loses one shard, which the result names, instead
of the whole run.  The checks'
records and pytest's outcomes come back through an events file (JSON lines), which the
optional ``progress`` callback follows while the subprocess runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from ...layers.errors import ConfigError
from . import selection
from .known import FAMILIES, KnownFailures
from .result import SuiteResult

KINDS = ("ops", "modules", "optims")
MODULES = {"ops": "fornax.contracts.torch_suite.ops_suite",
           "modules": "fornax.contracts.torch_suite.modules_suite",
           "optims": "fornax.contracts.torch_suite.optims_suite"}
#: shards of a full run per kind (each a subprocess)
FULL_SHARDS = {"ops": 8, "modules": 2, "optims": 1}


def _pytest(kinds: Sequence[str], env: dict, events: Path, timeout: float | None,
            progress: Callable[[dict], None] | None) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fornax.contracts.torch_suite.plugin",
           "-o", "addopts=", "-o", "python_files=*_suite.py", "--assert=plain", "--rootdir", str(events.parent), "--tb=no",
           "--no-header", "-rN", "--pyargs", *(MODULES[k] for k in kinds)]
    log = events.with_suffix(".log")
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=events.parent, stdout=out, stderr=subprocess.STDOUT)
        start, seen = time.monotonic(), 0
        while proc.poll() is None:
            time.sleep(0.5)
            seen = _follow(events, seen, progress)
            if timeout and time.monotonic() - start > timeout:
                proc.kill()
                proc.wait()
                break
        _follow(events, seen, progress)
    tail = log.read_text()[-2000:]
    return proc.returncode, tail


def _follow(events: Path, seen: int, progress) -> int:
    if progress is None or not events.exists():
        return seen
    lines = events.read_text().splitlines()
    for line in lines[seen:]:
        try:
            progress(json.loads(line))
        except json.JSONDecodeError:       # a line being written: read it next time
            return seen
        seen += 1
    return seen


def run_suite(vendor: str, *, full: bool = False, kinds: Sequence[str] = KINDS, progress: bool | Callable = False,
              only: Sequence[str] = (), known_failures: str | os.PathLike | None = None,
              dtypes: Sequence[str] = (), shards: dict | None = None, timeout: float | None = None
              ) -> SuiteResult:
    """Run PyTorch's OpInfo / ModuleInfo / OptimInfo checks on ``vendor``'s fornax device.

    ``full=False`` takes the fixed sample of :mod:`.selection`, ``full=True`` everything;
    ``only`` restricts to these names, ``dtypes`` the OpInfo dtypes; ``known_failures`` replaces the family's shipped
    table (a path); ``progress`` True prints one line per kind, or is a callable given every
    event (``{"event": "collected" | "test" | "check", ...}``).  ``timeout`` (seconds) bounds
    each subprocess."""
    if vendor not in FAMILIES:
        raise ConfigError(f"run_suite: unknown family {vendor!r}", hint=f"one of {', '.join(FAMILIES)}")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ConfigError(f"run_suite: unknown kind(s) {', '.join(bad)}", hint=f"kinds: {', '.join(KINDS)}")
    table = KnownFailures.load(Path(known_failures)) if known_failures else KnownFailures.for_family(vendor)
    if table.family != vendor:
        raise ConfigError(f"{table.path} is the table of {table.family}, not of {vendor}")
    callback = progress if callable(progress) else None
    result = SuiteResult(vendor=vendor, full=full)
    records: list[dict] = []
    # a full run: (kind,) per subprocess, in shards; the sample: every kind in one subprocess
    runs = [(kind,) for kind in kinds] if full else [tuple(kinds)]
    with tempfile.TemporaryDirectory(prefix="fornax-torch-suite-") as tmp:
        for run in runs:
            kind = "+".join(run)
            n = (shards or FULL_SHARDS).get(kind, 1) if full else 1
            for i in range(n):
                events = Path(tmp, f"{kind}-{i}.jsonl")
                env = {**os.environ, "FORNAX_VENDOR": vendor, selection.MODE: "full" if full else "sample",
                       selection.SHARD: f"{i}/{n}", selection.EVENTS: str(events),
                       selection.KNOWN: str(Path(table.path).resolve()), "PYTORCH_PRINT_REPRO_ON_FAILURE": "0"}
                env.pop("FORNAX_CONFIG", None)
                env.pop(selection.ONLY, None)
                env.pop(selection.ONLY_DTYPES, None)
                if dtypes:
                    env[selection.ONLY_DTYPES] = ",".join(dtypes)
                if only:
                    env[selection.ONLY] = ",".join(only)
                t0 = time.monotonic()
                rc, tail = _pytest(run, env, events, timeout, callback)
                got = _read(events)
                records += [r for r in got if r["event"] == "check"]
                _broken(result, kind, i, n, rc, tail, got)
                if progress is True:
                    print(f"{vendor} {kind} shard {i + 1}/{n}: {sum(r['event'] == 'check' for r in got)} checks "
                          f"in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    for r in records:
        result.add(r)
    _judge_run_level(result, records, table)
    return result


def _read(events: Path) -> list[dict]:
    if not events.exists():
        return []
    out = []
    for line in events.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:       # the last line of a killed run
            pass
    return out


def _broken(result: SuiteResult, kind: str, i: int, n: int, rc: int, tail: str, events: list[dict]) -> None:
    """What went wrong outside the checks: a test that failed before recording its check, a
    collection error, a crashed or killed subprocess."""
    where = f"{kind} shard {i + 1}/{n}"
    if not any(e["event"] == "collected" for e in events):
        result.errors.append(f"{where}: pytest collected nothing (exit {rc}): {tail[-800:]}")
        return
    checks = sum(e["event"] == "check" for e in events)
    failed_tests = [e for e in events if e["event"] == "test" and e["outcome"] == "failed"]
    recorded_failures = sum(e["event"] == "check" and e["outcome"] in ("failed", "stale") for e in events)
    if len(failed_tests) > recorded_failures:
        for e in failed_tests[:5]:
            if not any(w in e["error"] for w in ("samples differ from CPU", "STALE known failure")):
                result.errors.append(f"{where}: {e['nodeid']} ({e['when']}): {e['error'][-400:]}")
    if rc not in (0, 1, 5):
        result.errors.append(f"{where}: pytest exited with {rc} after {checks} checks "
                             f"(a crash or a timeout): {tail[-400:]}")


def _judge_run_level(result: SuiteResult, records: list[dict], table: KnownFailures) -> None:
    """Wildcard, ModuleInfo and OptimInfo entries: stale when every check they matched passed."""
    matched: dict[str, bool] = {}
    for r in records:
        if r["entry"] and r["wildcard"]:
            used = r["outcome"] == "known" or r.get("tolerated", 0) > 0
            matched[r["entry"]] = matched.get(r["entry"], False) or used
    for entry, failing in sorted(matched.items()):
        if not failing:
            result.stale.append(entry)
            kind = entry.split(":", 1)[0]
            group = "all" if kind != "ops" else entry.split(":")[-2]
            counts = result.kinds.setdefault(kind, {})
            if group in counts:
                counts[group].stale += 1
