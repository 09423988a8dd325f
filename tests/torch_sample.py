"""A deterministic sample of the torch suite (PyTorch's OpInfos, ModuleInfos and OptimInfos
through its own device-generic harness) on every family: nothing fails that the family's
known-failure table does not list, and no listed entry passes (issue 14, item 1).

The sample is fixed (:mod:`fornax.contracts.torch_suite.selection`: 1 OpInfo in 40, 1
ModuleInfo in 20, 1 OptimInfo in 3 by CRC-32 of the name, 2 samples per check); ``make
conformance-torch`` runs everything."""

from __future__ import annotations

from fornax.contracts.torch_suite import run_suite


def check_sample(family: str) -> None:
    """The family's sample run (one file per family, so the two test workers share them)."""
    r = run_suite(family, timeout=600)
    lines = [f"{f['kind']} {f['name']} {f['dtype']} {f['variant']}: {f['error']}" for f in r.failures]
    lines += [f"STALE {s}" for s in r.stale] + [f"BROKEN {e}" for e in r.errors]
    assert r.ok, "\n".join(lines)
    # every kind ran, OpInfos in all six dtypes and float32 backward
    assert set(r.kinds) == {"ops", "modules", "optims"}
    assert {"float32", "float16", "bfloat16", "int64", "bool", "complex64", "float32.backward"} <= set(r.kinds["ops"])
    assert r.kinds["ops"]["float32"].run >= 60 and r.kinds["modules"]["all"].run >= 30
    assert r.kinds["optims"]["all"].run >= 5
    assert set(r.to_json()) == {"vendor", "full", "kinds", "failures", "stale", "errors"}
    # docs/conformance.md shows this call and these fields (its block is not run again there)
    assert {"ops/float32", "modules/all", "optims/all"} <= set(r.rates)
    assert all(0.0 <= rate <= 1.0 for rate in r.rates.values())
