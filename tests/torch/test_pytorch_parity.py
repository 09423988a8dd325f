"""Parity with PyTorch's own device-generic tests: what they found fornax doing differently
from the CPU, each pinned against CPU eager (values, dtypes, strides) or against the CPU's
exact exception type and message."""

from __future__ import annotations

import warnings

import pytest
import torch

import fornax.frameworks.torch  # noqa: F401  (registers the device)

DEV = "fornax"


def _cpu_error(fn):
    """The exception type and message the CPU raises for ``fn("cpu")``."""
    with pytest.raises(Exception) as info:
        fn("cpu")
    return info.type, str(info.value).split("\n")[0]


def _same_error(fn):
    kind, message = _cpu_error(fn)
    with pytest.raises(kind) as info:
        fn(DEV)
    assert str(info.value).split("\n")[0] == message


# -- CPU index and mask tensors on a fornax tensor (CUDA accepts them) --------------------------
def test_cpu_long_index_reads_and_writes_like_cpu():
    base = torch.arange(12.0).reshape(4, 3)
    idx = torch.tensor([3, 0, 3])
    x = base.to(DEV)
    torch.testing.assert_close(x[idx].cpu(), base[idx])
    torch.testing.assert_close(x[:, torch.tensor([2, 0])].cpu(), base[:, torch.tensor([2, 0])])
    ref, got = base.clone(), base.to(DEV)
    ref[torch.tensor([1, 2])] = -1.0
    got[torch.tensor([1, 2])] = -1.0
    torch.testing.assert_close(got.cpu(), ref)


def test_cpu_bool_mask_assignment_and_index_put_with_cpu_indices():
    torch.manual_seed(0)
    base = torch.randn(5, 4)
    mask = torch.randn(5, 4) > 0.5
    ref, got = base.clone(), base.to(DEV)
    ref[mask] = 7.0
    got[mask] = 7.0
    torch.testing.assert_close(got.cpu(), ref)
    torch.testing.assert_close(got[mask].cpu(), ref[mask])
    rows, vals = torch.tensor([0, 4, 0]), torch.tensor([1.0, 2.0, 3.0])
    ref.index_put_((rows,), vals.unsqueeze(1).expand(3, 4), accumulate=True)
    got.index_put_((rows,), vals.unsqueeze(1).expand(3, 4).to(DEV), accumulate=True)
    torch.testing.assert_close(got.cpu(), ref)


def test_cpu_tensors_outside_indices_are_still_refused():
    x = torch.zeros(5, device=DEV)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.gather(x, 0, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x.index_put_((torch.tensor([0, 1]),), torch.tensor([1.0, 2.0]))    # values on the CPU


# -- checks the CPU kernels make --------------------------------------------------------------
@pytest.mark.parametrize("case", [
    "xlogy_ int", "angle out long", "abs out long", "all out float", "any out int",
    "argmax 65 dims", "oob index", "oob index_put", "abs_ complex", "index_fill complex",
    "add_ int float"])
def test_invalid_arguments_raise_like_cpu(case):
    fn = {
        "xlogy_ int": lambda d: torch.tensor([1, 2], device=d).xlogy_(torch.tensor([1.0, 2.0], device=d)),
        "angle out long": lambda d: torch.angle(torch.tensor([1.5], device=d),
                                                out=torch.empty(1, dtype=torch.long, device=d)),
        "abs out long": lambda d: torch.abs(torch.tensor([1.5], device=d),
                                            out=torch.empty(1, dtype=torch.long, device=d)),
        "all out float": lambda d: torch.all(torch.ones(3, device=d), out=torch.empty((), device=d)),
        "any out int": lambda d: torch.any(torch.ones(3, device=d), 0,
                                           out=torch.empty((), dtype=torch.int32, device=d)),
        "argmax 65 dims": lambda d: torch.argmax(torch.ones([1] * 65, device=d), dim=0),
        "oob index": lambda d: torch.zeros(5, device=d)[torch.tensor([1, 10], device=d)],
        "oob index_put": lambda d: torch.zeros(2, 5, device=d).__setitem__(
            (slice(None), torch.tensor([-6], device=d)), 0.0),
        "abs_ complex": lambda d: torch.tensor([1j], device=d).abs_(),
        "index_fill complex": lambda d: torch.ones(2, 2, device=d).index_fill_(
            1, torch.tensor([0], device=d), 1 + 1j),
        "add_ int float": lambda d: torch.tensor([1, 2], device=d).add_(torch.tensor([0.5, 1.5], device=d)),
    }[case]
    if case.startswith("abs out"):
        with pytest.raises(RuntimeError):       # the CPU's wording differs per path; the type is the contract
            fn(DEV)
        _cpu_error(fn)
        return
    _same_error(fn)


def test_valid_out_and_inplace_casts_still_run():
    a = torch.tensor([1.5, -2.0])
    got = torch.empty(2, dtype=torch.float64, device=DEV)
    torch.abs(a.to(DEV), out=got)                      # Float -> Double may cast
    torch.testing.assert_close(got.cpu(), torch.abs(a).double())
    b = torch.tensor([3, 4], dtype=torch.int32, device=DEV)
    b.add_(torch.tensor([1, 1], device=DEV))           # Long -> Int: same kind
    assert b.cpu().tolist() == [4, 5] and b.dtype == torch.int32
    out = torch.empty((), dtype=torch.uint8, device=DEV)
    torch.all(torch.ones(3, device=DEV), out=out)      # uint8 is the one other dtype all/any take
    assert out.item() == 1


@pytest.mark.parametrize("fn", [
    lambda d: torch.var(torch.ones(1, device=d)),
    lambda d: torch.std(torch.ones(3, 1, device=d), 1),
    lambda d: torch.var_mean(torch.ones(2, device=d), correction=2),
    lambda d: torch.var(torch.ones(1, dtype=torch.complex64, device=d)),
    lambda d: torch.var(torch.ones(2, device=d)),
], ids=["var", "std-dim", "var_mean-correction", "var-complex", "var-fine"])
def test_degrees_of_freedom_warning_like_cpu(fn):
    seen = {}
    for d in ("cpu", DEV):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            fn(d)
        seen[d] = [str(x.message).split(" (Triggered")[0] for x in w if x.category is UserWarning
                   and "degrees of freedom" in str(x.message)]
    assert seen[DEV] == seen["cpu"]


# -- schemas and formats --------------------------------------------------------------------------
def test_python_number_in_a_tensor_slot():
    a = torch.tensor([5.0, -3.0])
    torch.testing.assert_close(torch.copysign(a.to(DEV), -1.0).cpu(), torch.copysign(a, -1.0))
    torch.testing.assert_close(a.to(DEV).copysign_(2).cpu(), a.clone().copysign_(2))
    i = torch.tensor([1, -2], dtype=torch.int32)
    got, ref = torch.copysign(i.to(DEV), -1), torch.copysign(i, -1)
    assert got.dtype == ref.dtype
    torch.testing.assert_close(got.cpu(), ref)
    h = torch.tensor(2.0, dtype=torch.float16)
    assert torch.copysign(h.to(DEV), -1.0).dtype == torch.copysign(h, -1.0).dtype


@pytest.mark.parametrize("shape,fmt", [((2, 3, 4, 5), torch.channels_last),
                                       ((2, 3, 4, 5, 6), torch.channels_last_3d),
                                       ((2, 3), torch.contiguous_format)])
def test_resize_honours_memory_format(shape, fmt):
    ref = torch.empty(0).resize_(shape, memory_format=fmt)
    got = torch.empty(0, device=DEV).resize_(shape, memory_format=fmt)
    assert got.stride() == ref.stride()
    assert got.is_contiguous(memory_format=fmt)


def test_resize_memory_format_of_wrong_rank_raises_like_cpu():
    _same_error(lambda d: torch.empty(0, device=d).resize_(2, 3, memory_format=torch.channels_last))


# -- many-operand concatenation (PyTorch's batch-vs-slicing tests stack 1,024 rows) ---------------
class _RecordingCtx:
    def __init__(self):
        self.concats = []

    def op(self, name, *vals, axis):
        assert name == "concat"
        self.concats.append(len(vals))
        return ("concat", vals, axis)


def test_wide_concat_is_a_tree_of_narrow_concats():
    from fornax.frameworks.torch import concatenation
    ctx = _RecordingCtx()
    out = concatenation.concat(ctx, list(range(1000)), 0)
    assert max(ctx.concats) <= concatenation.FAN_IN
    assert sum(ctx.concats) == 1000 + len(ctx.concats) - 1       # every operand placed once, in a tree

    def leaves(v):
        return [v] if not isinstance(v, tuple) else [x for c in v[1] for x in leaves(c)]
    assert leaves(out) == list(range(1000))                       # order kept


@pytest.mark.parametrize("n,dim", [(300, 0), (40, 1), (17, -1)])
def test_stack_and_cat_of_many_tensors_match_cpu(n, dim):
    torch.manual_seed(0)
    rows = [torch.randn(3, 5) for _ in range(n)]
    dev = [r.to(DEV) for r in rows]
    torch.testing.assert_close(torch.stack(dev, dim).cpu(), torch.stack(rows, dim))
    torch.testing.assert_close(torch.cat(dev, dim).cpu(), torch.cat(rows, dim))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_mode_with_out_runs_on_the_device_like_cpu(dtype):
    torch.manual_seed(1)
    x = torch.randint(0, 3, (4, 5)).to(dtype)
    got = (torch.empty(0, dtype=dtype, device=DEV), torch.empty(0, dtype=torch.long, device=DEV))
    ref = (torch.empty(0, dtype=dtype), torch.empty(0, dtype=torch.long))
    torch.mode(x.to(DEV), 0, out=got)
    torch.mode(x, 0, out=ref)
    assert got[0].cpu().tolist() == ref[0].tolist() and got[1].cpu().tolist() == ref[1].tolist()
    values, indices = torch.mode(x.to(DEV), 1, keepdim=True)
    torch.testing.assert_close(values.cpu(), torch.mode(x, 1, keepdim=True).values)
    torch.testing.assert_close(indices.cpu(), torch.mode(x, 1, keepdim=True).indices)


# -- long index lists: sorted instead of walked (PyTorch's *_deterministic indexing tests) --------
def test_long_index_lists_take_the_sorted_scatter():
    from fornax.frameworks.torch import scatter
    assert scatter.MIN_SORTED <= 600


@pytest.mark.parametrize("dim", [0, 1])
def test_index_copy_and_add_with_many_duplicates_match_cpu(dim):
    from torch.testing._internal.common_utils import DeterministicGuard
    torch.manual_seed(dim)
    shape = [3, 4]
    shape[dim] = 50
    x = torch.randn(shape)
    src_shape = list(shape)
    src_shape[dim] = 600
    src = torch.randn(src_shape)
    index = torch.randint(40, (600,))            # duplicates, and rows nobody names
    with DeterministicGuard(True):               # the CPU's sequential order: the last write wins
        ref = torch.index_copy(x, dim, index, src)
    got = torch.index_copy(x.to(DEV), dim, index.to(DEV), src.to(DEV))
    torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0)
    got = torch.index_add(x.to(DEV), dim, index.to(DEV), src.to(DEV), alpha=1.5)
    torch.testing.assert_close(got.cpu(), torch.index_add(x, dim, index, src, alpha=1.5))


def test_index_put_accumulate_long_list_of_integers_matches_cpu():
    torch.manual_seed(3)
    idx = torch.randint(-9, 9, (700,))            # negative indices count from the end
    vals = torch.randint(-5, 5, (700,), dtype=torch.int32)
    base = torch.randint(0, 3, (9,), dtype=torch.int32)
    ref = base.index_put((idx,), vals, accumulate=True)
    got = base.to(DEV).index_put((idx.to(DEV),), vals.to(DEV), accumulate=True)
    assert got.cpu().tolist() == ref.tolist()


def test_index_into_a_dimension_of_size_zero_raises_like_cpu():
    _same_error(lambda d: torch.empty(10, 0, device=d)[:, torch.tensor([0, 1], device=d)])
    assert torch.empty(10, 0, device=DEV)[[1, 2]].shape == (2, 0)


def test_the_eager_device_bounds_its_timeline_history():
    from fornax.frameworks.torch import session
    timeline = session.current().stack.devices[0].timeline
    assert timeline.record_limit == session.RECORD_LIMIT
    saved = timeline.record_limit
    timeline.record_limit = 64
    try:
        before = timeline.records_dropped
        x = torch.ones(8, device=DEV)
        for _ in range(200):
            x = x + 1
        assert x.cpu().tolist() == [201.0] * 8
        assert len(timeline.records) <= 64 and timeline.records_dropped > before
    finally:
        timeline.record_limit = saved
