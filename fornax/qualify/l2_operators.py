"""L2, operator coverage: PyTorch's OpInfo samples of named operators match CPU eager, and
PyTorch's OpInfo database through its device-generic harness meets its targets."""

from __future__ import annotations

from ..contracts.clause import Outcome
from .clients import suite_outcome
from .levels import OPINFO_OPS, OPINFO_SAMPLES, OPINFO_THRESHOLD, evidence
from .subject import StackSubject


@evidence("L2", "opinfo", f"PyTorch OpInfo samples of {len(OPINFO_OPS)} operators match CPU eager",
          seam="framework", measured="sample pass rate", relation=">=", limit=OPINFO_THRESHOLD,
          dtype="float32", shape=f"OpInfo sample_inputs, first {OPINFO_SAMPLES} per operator")
def _l2_opinfo(s: StackSubject) -> Outcome:
    from ..frameworks.torch.opinfo import run_opinfo
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


@evidence("L2", "opinfo_suite", "PyTorch's OpInfo database through instantiate_device_type_tests: "
          "forward, out=, in-place, noncontiguous and float32 backward match CPU", seam="framework",
          measured="sample pass rate (known failures listed with reasons do not pass)", relation=">=",
          limit="99.5% float32, 99% other dtypes and backward, per dtype",
          dtype="float32, float16, bfloat16, int64, bool, complex64",
          shape="op_db samples made on the device (--full: every OpInfo)")
def _l2_opinfosuite_result(s: StackSubject) -> Outcome:
    return suite_outcome(s, "ops")
