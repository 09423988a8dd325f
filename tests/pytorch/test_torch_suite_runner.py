"""The torch suite's runner itself: known-failure tables, staleness, and that a wrong result
on fornax is caught (issue 14, item 1)."""

from __future__ import annotations

import pytest
import torch

from fornax.contracts.torch_suite import compare, run_suite
from fornax.contracts.torch_suite.known import FAMILIES, KnownFailures
from fornax.contracts.torch_suite.result import SuiteResult
from fornax.contracts.torch_suite.runner import _judge_run_level
from fornax.layers.errors import ConfigError

ENTRY = '''
[[failure]]
kind = "ops"
name = "{name}"
dtype = "{dtype}"
variant = "{variant}"
reason = "{reason}"
'''


def table(tmp_path, family="cuda-like", **entry):
    e = {"name": "abs", "dtype": "float32", "variant": "forward",
         "reason": "listed on purpose by the runner's test", **entry}
    path = tmp_path / f"{family}.toml"
    path.write_text(f'schema = "fornax.known-failures/1"\nfamily = "{family}"\n' + ENTRY.format(**e))
    return path


def test_the_shipped_tables_are_valid_and_name_their_family():
    for family in FAMILIES:
        t = KnownFailures.for_family(family)
        assert t.family == family
        assert all(len(e.reason) >= 12 for e in t.entries)


@pytest.mark.parametrize("entry, message", [
    ({"variant": "sideways"}, "failure/0/variant"),
    ({"dtype": "float99"}, "failure/0/dtype"),
    ({"reason": "fails"}, "failure/0/reason"),
])
def test_the_schema_rejects_a_bad_table(tmp_path, entry, message):
    with pytest.raises(ConfigError, match=message) as info:
        KnownFailures.load(table(tmp_path, **entry))
    assert str(tmp_path) in str(info.value)


def test_a_table_without_reason_or_with_a_repeated_entry_is_rejected(tmp_path):
    bad = tmp_path / "cuda-like.toml"
    bad.write_text('schema = "fornax.known-failures/1"\nfamily = "cuda-like"\n[[failure]]\nkind = "ops"\nname = "abs"\ndtype = "float32"\n'
                   'variant = "forward"\n')
    with pytest.raises(ConfigError, match="'reason' is a required property"):
        KnownFailures.load(bad)
    twice = table(tmp_path)
    twice.write_text(twice.read_text() + ENTRY.format(name="abs", dtype="float32", variant="forward",
                                                      reason="the same entry a second time"))
    with pytest.raises(ConfigError, match=r"failure\[1\] repeats failure\[0\]"):
        KnownFailures.load(twice)


def test_a_stale_entry_fails_the_run(tmp_path):
    """abs in float32 passes on fornax: an entry saying it fails is stale, and the run not ok."""
    r = run_suite("cuda-like", kinds=("ops",), only=("abs",), dtypes=("float32",),
                  known_failures=table(tmp_path))
    assert r.stale == ["ops:abs:float32:forward"]
    assert r.kinds["ops"]["float32"].stale == 1
    assert r.kinds["ops"]["float32"].failed == 0 and r.kinds["ops"]["float32"].run > 0
    assert not r.ok
    assert r.to_json()["stale"] == ["ops:abs:float32:forward"]


def test_a_table_of_another_family_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is the table of rocm-like, not of cuda-like"):
        run_suite("cuda-like", only=("abs",), known_failures=table(tmp_path, family="rocm-like"))


def test_wildcard_and_module_entries_are_judged_over_the_run():
    r = SuiteResult("cuda-like", False)
    rec = {"kind": "modules", "name": "nn.Linear", "dtype": "float32", "variant": "to", "run": 2, "passed": 2,
           "failed": 0, "errors": [], "outcome": "passed", "reason": "x", "entry": "modules:nn.Linear:float32:to",
           "wildcard": True}
    known = dict(rec, name="nn.GRU", entry="modules:nn.GRU:float32:to", outcome="known", passed=1, failed=1)
    passing_twin = dict(known, outcome="passed", passed=2, failed=0)      # eval mode passes, train fails
    for x in (rec, known, passing_twin):
        r.add(x)
    _judge_run_level(r, [rec, known, passing_twin], None)
    assert r.stale == ["modules:nn.Linear:float32:to"]
    c = r.kinds["modules"]["all"]
    assert (c.run, c.passed, c.known, c.failed, c.stale) == (6, 5, 1, 0, 1)


# -- the comparison catches what it must ------------------------------------------------------
@pytest.fixture(scope="module")
def abs_op():
    from torch.testing._internal.common_methods_invocations import op_db
    return next(o for o in op_db if o.name == "abs" and not o.variant_test_name)


class Wrong:
    """An OpInfo whose op computes something else (or raises, or stays on the CPU) on fornax."""

    def __init__(self, op, on_fornax):
        self.op, self.on_fornax = op, on_fornax

    def __getattr__(self, name):
        return getattr(self.op, name)

    def __call__(self, x, *args, **kwargs):
        return self.on_fornax(x) if x.device.type == "fornax" else self.op(x, *args, **kwargs)


def _sample(op):
    return next(iter(op.sample_inputs("fornax", torch.float32)))


def test_a_wrong_value_on_fornax_is_caught(abs_op):
    s = _sample(abs_op)
    assert compare.forward(abs_op, s, torch.float32, 0) == ""
    why = compare.forward(Wrong(abs_op, lambda x: x.abs() + 1e-3), s, torch.float32, 0)
    assert "Tensor-likes are not close" in why


def test_a_result_left_on_the_cpu_is_caught(abs_op):
    why = compare.forward(Wrong(abs_op, lambda x: x.cpu().abs()), _sample(abs_op), torch.float32, 0)
    assert why == "a result is on cpu, not on fornax"


def test_error_parity_is_required(abs_op):
    def raising(x):
        raise ValueError("only on fornax")

    assert compare.forward(Wrong(abs_op, raising), _sample(abs_op), torch.float32, 0) == \
        "ValueError: only on fornax"
    cpu_raises = Wrong(abs_op, lambda x: x.abs())
    cpu_raises.op = lambda x, *a, **k: (_ for _ in ()).throw(RuntimeError("only on CPU"))
    why = compare.forward(cpu_raises, _sample(abs_op), torch.float32, 0)
    assert why == "CPU raised RuntimeError: only on CPU; fornax raised nothing"


def test_a_wrong_gradient_is_caught(abs_op):
    s = next(iter(abs_op.sample_inputs("fornax", torch.float32, requires_grad=True)))
    assert compare.backward(abs_op, s, torch.float32, 0) == ""
    why = compare.backward(Wrong(abs_op, lambda x: x.abs() * 1.01), s, torch.float32, 0)
    assert "Tensor-likes are not close" in why


def test_onlyNativeDeviceTypes_sees_fornax():
    from torch.testing._internal.common_utils import NATIVE_DEVICES
    from torch.testing._internal.common_device_type import PrivateUse1TestBase, get_device_type_test_bases
    assert "fornax" in NATIVE_DEVICES
    assert PrivateUse1TestBase in get_device_type_test_bases()


def test_out_variants_that_return_nothing_and_the_device_of_results():
    """unbind_copy's out= overload returns nothing on the CPU: the device must too, and its
    out= tensors must hold CPU's values; *_like samples that ask for device="cpu" stay there."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    from fornax.contracts.torch_suite import compare
    unbind = next(o for o in op_db if o.name == "unbind_copy")
    sample = next(iter(unbind.sample_inputs("fornax", torch.float32)))
    assert compare.out(unbind, sample, torch.float32, 0) == ""
    like = next(o for o in op_db if o.name == "randn_like")
    for s in like.sample_inputs("fornax", torch.float32):
        want = torch.device(s.kwargs["device"]).type if "device" in s.kwargs else "fornax"
        assert compare.home(s) == want
    factory = torch.zeros(2, device="fornax")
    assert compare.same(factory.cpu(), torch.zeros(2), unbind, torch.float32) == \
        "a result is on cpu, not on fornax"


# -- tolerance entries and PyTorch's own skips ------------------------------------------------
def test_a_tolerance_entry_covers_only_what_is_within_its_bounds(abs_op, monkeypatch):
    from fornax.contracts.torch_suite.record import WITHIN, Check
    s = _sample(abs_op)
    off = Wrong(abs_op, lambda x: x.abs() + 1e-4)        # beyond PyTorch's float32 default (1e-5)
    assert not compare.forward(off, s, torch.float32, 0).startswith(WITHIN)
    monkeypatch.setattr(compare, "TOLERANCE", {"atol": 1e-3, "rtol": 1e-5})
    assert compare.forward(off, s, torch.float32, 0).startswith(WITHIN)
    far = Wrong(abs_op, lambda x: x.abs() + 1e-2)
    assert not compare.forward(far, s, torch.float32, 0).startswith(WITHIN)
    c = Check("ops", "abs", "float32", "forward")
    c.add(WITHIN + "close", "sample 0")
    c.add("", "sample 1")
    assert (c.run, c.passed, c.tolerated, c.failed) == (2, 2, 1, 0)
    c.add("far off", "sample 2")
    assert (c.run, c.passed, c.failed, c.errors) == (3, 2, 1, ["sample 2: far off"])
    r = SuiteResult("cuda-like", False)
    r.add({"kind": "ops", "name": "abs", "dtype": "float32", "variant": "forward", "run": 3, "passed": 2,
           "tolerated": 1, "failed": 1, "errors": c.errors, "outcome": "failed", "reason": "", "entry": "x",
           "wildcard": False})
    got = r.kinds["ops"]["float32"]
    assert (got.passed, got.tolerated, got.failed, got.known) == (2, 1, 1, 0)
    assert [f["error"] for f in r.failures] == ["sample 2: far off"]
    # a wildcard tolerance entry in use is not stale; one whose checks all pass at PyTorch's tolerance is
    rec = {"kind": "ops", "name": "abs", "dtype": "float16", "variant": "out", "run": 2, "passed": 2, "failed": 0,
           "errors": [], "reason": "x", "entry": "ops:abs:*:*", "wildcard": True}
    used, unused = SuiteResult("cuda-like", False), SuiteResult("cuda-like", False)
    _judge_run_level(used, [dict(rec, outcome="passed", tolerated=1)], None)
    _judge_run_level(unused, [dict(rec, outcome="passed", tolerated=0)], None)
    assert used.stale == [] and unused.stale == ["ops:abs:*:*"]


def test_a_tolerance_needs_both_bounds(tmp_path):
    path = table(tmp_path)
    path.write_text(path.read_text() + "atol = 1e-4\n")
    with pytest.raises(ConfigError, match="dependent|rtol"):
        KnownFailures.load(path)
    path.write_text(path.read_text() + "rtol = 1e-5\n")
    assert KnownFailures.load(path).entries[0].tolerance == {"atol": 1e-4, "rtol": 1e-5}
    path.write_text(path.read_text().replace('kind = "ops"', 'kind = "optims"'))
    assert KnownFailures.load(path).entries[0].tolerance == {"atol": 1e-4, "rtol": 1e-5}
    path.write_text(path.read_text().replace("atol = 1e-4", "atol = 0"))
    with pytest.raises(ConfigError, match="atol"):
        KnownFailures.load(path)


def test_variants_pytorch_skips_on_every_device_are_skipped_with_its_reason():
    from torch.testing._internal.common_methods_invocations import op_db
    op = next(o for o in op_db if o.name == "as_strided_scatter")
    why = compare.upstream_skip(op, torch.float32, "noncontiguous")
    assert "test_noncontiguous_samples" in why and "fails for everything else" in why
    assert compare.upstream_skip(op, torch.float32, "forward") is None
    abs_op = next(o for o in op_db if o.name == "abs" and not o.variant_test_name)
    assert compare.upstream_skip(abs_op, torch.float32, "noncontiguous") is None


def test_the_closure_optimizers_problem_is_well_conditioned_on_the_cpu(monkeypatch):
    """A comparison with the CPU means something only where the CPU agrees with itself: one
    float32 ulp on every initial parameter must not move LBFGS's own result beyond PyTorch's
    float32 tolerance (on the linear model's non-convex loss it moved it by over 10)."""
    from torch.testing._internal.common_optimizers import optim_db
    from fornax.contracts.torch_suite import optims_suite
    info = next(o for o in optim_db if o.name == "LBFGS")
    want = optims_suite._trajectory(info, {}, "cpu", True)
    nudged = optims_suite._params

    def params(device, with_bias):
        ps = nudged(device, with_bias)
        with torch.no_grad():
            for p in ps:
                p.copy_(torch.nextafter(p, torch.full_like(p, 10.0)))
        return ps
    monkeypatch.setattr(optims_suite, "_params", params)
    got = optims_suite._trajectory(info, {}, "cpu", True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
