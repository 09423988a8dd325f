"""Golden reports: a fixed set of ``--json`` CLI runs whose output must not change
when code is moved between modules.

``python -m tests.golden.reports record`` rewrites ``tests/golden/reports.json``
from the current code (do that only when a change of behaviour is intended and
say so in the commit); ``tests/test_golden_reports.py`` runs the same commands
and compares.  Host wall-clock readings are the only fields removed: every
simulated time, count, byte, binary digest and numeric result stays in; the error
figures of a numerics check depend on the host's BLAS, so for them only the check's
``ok`` is compared exactly.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner

from fornax.cli.main import main as cli
from fornax.stack import BUILTIN_FAMILIES

GOLDEN = Path(__file__).with_name("reports.json")

# Keys whose values are host wall-clock readings or host paths (they differ between
# two runs of the same command on the same machine); everything else is compared.
HOST_KEYS = frozenset({
    "compile_wall_s", "wall_s", "host_wall_s", "directory", "module_load_s",
    "python", "numpy", "torch", "jax", "jaxlib",
})


def commands() -> dict[str, list[str]]:
    """Name -> argv of every golden run."""
    runs: dict[str, list[str]] = {}
    for fam in BUILTIN_FAMILIES:
        for fw, workload in (("graph", "mlp"), ("graph", "transformer-block"), ("graph", "mlp-bf16"),
                             ("torch", "mlp-train"), ("torch", "conv-net"), ("jax", "mlp-train")):
            runs[f"compose {fam} {fw} {workload}"] = [
                "compose", "--vendor", fam, "--framework", fw, "--workload", workload, "--json"]
        runs[f"compose {fam} graph mlp no-fuse"] = ["compose", "--vendor", fam, "--no-fuse", "--json"]
        runs[f"compile {fam} mlp binary"] = ["compile", "--vendor", fam, "--workload", "mlp", "--emit", "binary"]
        runs[f"compile {fam} transformer-block asm"] = [
            "compile", "--vendor", fam, "--workload", "transformer-block", "--emit", "asm"]
    # runs across families: mixed front seams, and a binary translated between compiler and driver
    cuda, rocm, xpu = BUILTIN_FAMILIES[:3]
    runs["compose mixed framework+runtime"] = ["compose", "--vendor", cuda, "--seam", f"framework={xpu}",
                                               "--seam", f"runtime={rocm}", "--json"]
    runs["compose mixed translated"] = ["compose", "--vendor", xpu, "--seam", f"compiler={cuda}", "--json"]
    return runs


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in HOST_KEYS}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def run(argv: list[str]) -> object:
    """One command, cold compile cache: its JSON with host readings removed, or the
    sha256 and size of a binary / the text of an asm listing."""
    with tempfile.TemporaryDirectory() as cache:
        old = os.environ.get("FORNAX_CACHE_DIR")
        os.environ["FORNAX_CACHE_DIR"] = cache
        try:
            result = CliRunner().invoke(cli, argv, catch_exceptions=False)
        finally:
            if old is None:
                os.environ.pop("FORNAX_CACHE_DIR", None)
            else:
                os.environ["FORNAX_CACHE_DIR"] = old
    if result.exit_code != 0:
        raise RuntimeError(f"fornax {' '.join(argv)} exited {result.exit_code}: {result.output[-2000:]}")
    if "--json" in argv:
        return _strip(json.loads(result.stdout))
    if "binary" in argv:
        data = result.stdout_bytes
        return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    return result.stdout


def record() -> None:
    out = {name: run(argv) for name, argv in commands().items()}
    GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN} ({len(out)} runs)")


#: error figures against a float64 reference: the host's BLAS (its instruction set, its
#: summation order) moves them by several times in the last bits of float32, so only whether
#: they are within tolerance (each entry's ``ok``, compared exactly) is golden
_HOST_DEPENDENT = ("max_abs_err", "max_rel_err")


def _diff(want, got, path: str, out: list[str]) -> None:
    if path.rsplit(".", 1)[-1] in _HOST_DEPENDENT:
        if not (isinstance(want, (int, float)) and isinstance(got, (int, float)) and got >= 0):
            out.append(f"{path}: {want!r} -> {got!r}")
        return
    if isinstance(want, dict) and isinstance(got, dict):
        for k in sorted(set(want) | set(got)):
            if k not in got or k not in want:
                out.append(f"{path}.{k}: {'missing' if k not in got else 'new'}")
            else:
                _diff(want[k], got[k], f"{path}.{k}", out)
    elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got)):
            _diff(a, b, f"{path}[{i}]", out)
    elif want != got:
        out.append(f"{path}: {str(want)[:80]!r} -> {str(got)[:80]!r}")


def check() -> int:
    """Rerun every golden command; print the differing fields; 0 when all match."""
    golden = json.loads(GOLDEN.read_text())
    problems: list[str] = []
    for name, argv in commands().items():
        if name not in golden:
            problems.append(f"{name}: not recorded")
            continue
        _diff(golden[name], json.loads(json.dumps(run(argv))), name, problems)
    for line in problems[:60]:
        print(line)
    print(f"{len(problems)} difference(s) over {len(golden)} runs")
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["record"]:
        record()
    elif sys.argv[1:] == ["check"]:
        sys.exit(check())
    else:
        sys.exit("usage: python -m tests.golden.reports record|check")
