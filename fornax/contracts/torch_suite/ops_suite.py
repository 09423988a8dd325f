"""Every OpInfo of PyTorch's ``op_db`` on the fornax device, against the CPU.

Written on PyTorch's own machinery: ``@ops(op_db)`` parametrizes over OpInfos and the dtypes
CPU supports (of :data:`~.selection.DTYPES`), ``instantiate_device_type_tests(...,
only_for="fornax")`` instantiates the tests for the ``fornax`` device through
``PrivateUse1TestBase``.  Variants: forward, noncontiguous, out= and in-place in every dtype,
backward in float32 (see :mod:`.compare`).  The selection (sampled or full, shards) comes
from the environment (:mod:`.selection`); the verdict against the family's known-failure
table from :mod:`.record`.
"""

from __future__ import annotations

import warnings

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase

import fornax.frameworks.torch  # noqa: F401  (the device, even without the autoload entry point)

from ...frameworks.torch.opinfo import full_name
from . import compare, harness, selection
from .record import Check

harness.install()

DTYPES = tuple(getattr(torch, d) for d in selection.dtypes())

SELECTED = selection.select("ops", op_db, full_name)
WITH_OUT = [o for o in SELECTED if o.supports_out]
WITH_INPLACE = [o for o in SELECTED if o.inplace_variant is not None]
WITH_AUTOGRAD = [o for o in SELECTED if o.supports_autograd]


def run_check(device, dtype, op, variant: str) -> None:
    name = full_name(op)
    check = Check("ops", name, str(dtype).removeprefix("torch."), variant)
    skip = compare.upstream_skip(op, dtype, variant)
    if skip:
        check.skip(skip)
        return
    entry = check.entry_for()
    limit = selection.sample_limit(entry is not None)
    judge = compare.VARIANTS[variant]
    i = 0
    compare.TOLERANCE = entry.tolerance if entry is not None else None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)   # op_db's deprecated overloads
        warnings.filterwarnings("ignore", category=FutureWarning)
        harness.seed(compare.seed_of(name, -1))
        try:
            samples = iter(op.sample_inputs(device, dtype, requires_grad=variant == "backward"))
            while limit is None or check.run < limit:
                try:
                    sample = next(samples)
                except StopIteration:
                    break
                check.add(judge(op, sample, dtype, compare.seed_of(name, i)), f"sample {i}")
                i += 1
        except Exception as exc:        # making samples on the device is part of the check
            check.add(f"generating samples on fornax: {compare.short(exc)}", f"sample {i}")
        finally:
            compare.TOLERANCE = None
    check.finish()


def _ops(op_list, **kwargs):
    """PyTorch's ``@ops``, except that a variant none of the selected OpInfos has (a shard or
    an ``only`` list without an out= op, say) defines no test instead of refusing the list."""
    if op_list:
        return ops(op_list, **kwargs)
    return lambda fn: None


class TestFornaxOps(TestCase):
    @_ops(SELECTED, allowed_dtypes=DTYPES)
    def test_forward(self, device, dtype, op):
        run_check(device, dtype, op, "forward")

    @_ops(SELECTED, allowed_dtypes=DTYPES)
    def test_noncontiguous(self, device, dtype, op):
        run_check(device, dtype, op, "noncontiguous")

    @_ops(WITH_OUT, allowed_dtypes=DTYPES)
    def test_out(self, device, dtype, op):
        run_check(device, dtype, op, "out")

    @_ops(WITH_INPLACE, allowed_dtypes=DTYPES)
    def test_inplace(self, device, dtype, op):
        run_check(device, dtype, op, "inplace")

    @_ops(WITH_AUTOGRAD if torch.float32 in DTYPES else [], allowed_dtypes=(torch.float32,))
    def test_backward(self, device, dtype, op):
        run_check(device, dtype, op, "backward")


for _name in [n for n, v in vars(TestFornaxOps).items() if n.startswith("test_") and v is None]:
    delattr(TestFornaxOps, _name)
instantiate_device_type_tests(TestFornaxOps, globals(), only_for="fornax")
