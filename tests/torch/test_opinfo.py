"""PyTorch's own OpInfo samples on the ``fornax`` device against CPU eager (issue 7, item 5).

The sweep runs the float32 samples of the 150 most used ops (:data:`TOP_OPS`) on the
cuda-like stack and requires at least 95 % of them to match CPU eager with PyTorch's
tolerances.  To keep the suite fast on two cores it takes the first ``MAX_SAMPLES``
samples of each op (about 900 samples, ~30 s; every sample of every op takes ~2.5 min,
most of it in ``max_pool2d``'s 1440 samples — ``python -m benchmarks.opinfo`` runs more
per vendor).  A handful of ops run all their samples and their ATen routes are checked
exactly, and the runner itself is checked to catch wrong values, results left on the
CPU and mismatched errors.
"""

from __future__ import annotations

import pytest
import torch

import fornax.frameworks.torch as ft
from fornax.frameworks.torch import opinfo as O
from fornax.layers.errors import ConfigError

MAX_SAMPLES = 8


@pytest.fixture(scope="module")
def db():
    return O.op_db()


@pytest.fixture(autouse=True)
def cuda_like():
    ft.use_stack("cuda-like")
    yield


def test_the_list_is_150_distinct_op_db_names_with_float32_samples(db):
    assert len(O.TOP_OPS) == 150 and len(set(O.TOP_OPS)) == 150
    assert all(n in db for n in O.TOP_OPS), [n for n in O.TOP_OPS if n not in db]
    assert all(torch.float32 in db[n].supported_dtypes("cpu") for n in O.TOP_OPS)
    with pytest.raises(ConfigError, match="not OpInfo names of PyTorch's op_db: nn.functional.relu7"):
        O.run_opinfo(["add", "nn.functional.relu7"])


def test_float32_samples_of_the_150_ops_pass_on_cuda_like(db):
    summary = O.run_opinfo(max_samples=MAX_SAMPLES)
    failing = "\n".join(f"{r.name}: {r.failed}/{r.run} failed; {r.first_error}" for r in summary.failing())
    assert summary.run >= 800, summary.run
    assert summary.rate >= 0.95, f"pass rate {summary.rate:.1%}; failing ops:\n{failing}"
    # most of the list stays on the device (no ATen op fell back to the CPU), and what the
    # framework seam claims as native is right as often
    assert len(summary.native) >= 128, sorted(
        (r.name, r.fallbacks) for r in summary.results if not r.native)
    assert summary.native_rate >= 0.95, failing
    by = {r.name: r for r in summary.results}
    assert by["nn.functional.conv2d"].routes[("aten::convolution", "native")] > 0
    # dropout draws its mask from the host generator and multiplies on the device
    assert by["nn.functional.dropout"].fallbacks == []
    assert by["nn.functional.dropout"].routes[("aten::native_dropout", "native")] > 0


@pytest.mark.parametrize("name, native_ops", [
    ("nn.functional.conv2d", ["aten::convolution"]),
    ("softmax", ["aten::_softmax"]),
    ("nn.functional.cross_entropy", ["aten::_log_softmax"]),
    ("scatter", ["aten::scatter"]),
    ("index_put", ["aten::index_put"]),
    ("nn.functional.layer_norm", ["aten::native_layer_norm"]),
    ("addmm", ["aten::addmm"]),
])
def test_every_sample_of_core_ops_passes_natively(db, name, native_ops):
    res = O.run_opinfo([name]).results[0]
    assert res.run > 0 and res.passed == res.run, res.first_error
    native = {op.split(".")[0] for op, kind in res.routes if kind == "native"}   # any overload
    assert set(native_ops) <= native, (native_ops, dict(res.routes))
    # only zero-size inputs (which the device answers on the host) and a boolean-mask put
    # whose values differ per element may leave the device
    allowed = {"aten::_index_put_impl", "aten::index_put"} if name == "index_put" else set()
    assert set(res.fallbacks) <= allowed | {"aten::mm", "aten::addmm", "aten::cat"}, res.fallbacks


class _Fake:
    """An OpInfo stand-in: a callable with no tolerance overrides."""

    decorators = ()

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def test_the_runner_catches_wrong_values_host_results_and_error_mismatches(db):
    x = O.sample(torch.randn(3, 4))
    assert O.run_sample(_Fake(torch.tanh), x)[0] is True
    ok, why, routes = O.run_sample(_Fake(lambda t: torch.tanh(t) + (t.device.type == "fornax") * 1e-4), x)
    assert ok is False and "not close" in why
    assert ("aten::tanh", "native") in {(op.split(".")[0], kind) for op, kind in routes}, routes
    ok, why, _ = O.run_sample(_Fake(lambda t: t.cpu() * 2), x)
    assert ok is False and "on cpu, not on fornax" in why
    # the same exception type on both sides is error parity; a different one is a failure
    bad = O.sample(torch.ones(2, 3), torch.ones(2, 3))
    assert O.run_sample(db["mm"], bad)[0] is True

    def picky(t):
        if t.device.type == "fornax":
            raise ValueError("fornax only")
        raise RuntimeError("cpu only")
    ok, why, _ = O.run_sample(_Fake(picky), x)
    assert ok is False and "CPU raised RuntimeError" in why and "ValueError" in why
    # a sample with no tensor and no device touches nothing on fornax: not counted
    assert O.run_sample(db["arange"], O.sample(3))[0] is None


def test_tolerances_are_the_opinfos_own_else_pytorchs_defaults(db):
    assert O.tolerances(db["add"], torch.float32) == {}
    assert O.tolerances(db["matmul"], torch.float32) == {"atol": 1e-5, "rtol": 1e-5}
    assert O.tolerances(db["nn.functional.scaled_dot_product_attention"], torch.float32) == \
        {"atol": 5e-5, "rtol": 5e-6}
    # looser than PyTorch's float32 defaults, never tighter
    assert O.tolerances(db["nn.functional.layer_norm"], torch.float32)["atol"] >= 1e-5
