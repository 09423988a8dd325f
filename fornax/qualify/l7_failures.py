"""L7, failure handling and diagnosability: an injected device fault and an out-of-memory
give a clear error with the family's vendor code and a hint, and the process keeps working;
a bad config is a one-line error; ``torch.profiler`` shows each op's device time."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..contracts.clause import Outcome
from ..layers.errors import ConfigError, FornaxError
from ..sim.faults import FaultPlan, FaultSpec
from ..stack import Stack, compose, load_config
from .levels import evidence
from .models import mlp
from .subject import StackSubject, torch_fornax


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


def _still_works(s: StackSubject) -> str | None:
    """Why the stack under test does not compute after a failure (None: it does)."""
    import torch
    s.torch()
    g = torch.Generator().manual_seed(s.config.seed + 70)
    x = torch.randn(4, 8, generator=g)
    got = (x.to("fornax") * 2 + 1).cpu()
    return None if torch.equal(got, x * 2 + 1) else "x * 2 + 1 on the device differs from CPU"


@evidence("L7", "fault", "an injected uncorrectable ECC error gives an error with the family's "
          "vendor code and a hint; the process keeps working", seam="driver",
          measured="vendor code of the error", relation="==", limit="a code of the family's table",
          dtype="float32", shape="[4, 8]")
def _l7_fault(s: StackSubject) -> Outcome:
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
    return Outcome(str(error.code) if error is not None and error.code else None, not problems,
                  "; ".join(problems) or f"{type(error).__name__}: {msg}; the stack under test "
                  "computes correctly afterwards", build=s.build(faulty))


@evidence("L7", "oom", "an allocation beyond device memory gives an out-of-memory error with the "
          "family's vendor code and a hint; the stack keeps working", seam="runtime",
          measured="vendor code of the error", relation="==", limit="a code of the family's table",
          dtype="uint8", shape="[2 x device memory]")
def _l7_oom(s: StackSubject) -> Outcome:
    import torch
    s.torch()
    total = torch_fornax().get_device_properties().total_memory
    before = torch_fornax().memory_allocated()
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
    if torch_fornax().memory_allocated() != before:
        problems.append(f"memory_allocated moved from {before} to {torch_fornax().memory_allocated()} "
                        "after the failed allocation")
    broken = _still_works(s)
    if broken:
        problems.append(f"afterwards: {broken}")
    msg = " ".join(str(error).split()) if error is not None else ""
    return Outcome(str(error.code) if error is not None and error.code else None, not problems,
                   "; ".join(problems) or f"{type(error).__name__}: {msg[:240]}; the stack keeps "
                   "computing")


@evidence("L7", "bad_config", "a bad stack config (an unknown key, a misspelt vendor) is a one-line "
          "error naming what is wrong", seam=None, measured="one-line config errors",
          relation="==", limit=2)
def _l7_bad_config(s: StackSubject) -> Outcome:
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


@evidence("L7", "profiling", "torch.profiler (ProfilerActivity.PrivateUse1) gives per-op rows with "
          "the device time of each op's kernels", seam="framework",
          measured="profiled device time vs the kernels' simulated time", relation="==",
          limit="equal, every device op timed", dtype="float32", shape="MLP step x [4, 16]")
def _l7_profiling(s: StackSubject) -> Outcome:
    import torch
    from torch.profiler import ProfilerActivity, profile
    session = s.torch()
    torch.manual_seed(s.config.seed + 70)
    model = mlp().to("fornax")
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
