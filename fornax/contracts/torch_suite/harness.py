"""PyTorch's test harness with two slow paths made cheap for a long run on a simulated device.

Both keep PyTorch's behaviour; they only skip work whose result the suite never uses:

* ``extract_test_fn`` (``torch.testing._internal.common_utils``) finds the running test
  function by walking the stack with ``inspect.stack()``, which also reads every frame's
  source lines: about 0.2 s per call with fornax's frames on the stack, and ``OpInfo``
  calls it for every ``sample_inputs``.  :func:`extract_test_fn` walks the same frames
  without reading source.
* ``torch.manual_seed`` also seeds CUDA, XPU and MTIA, whose lazy-initialisation hooks
  format a stack trace on every call when those devices are absent.  fornax's random
  numbers come from the host generator (``torch.fornax.manual_seed_all`` seeds it), so
  :func:`seed` seeds exactly that.
"""

from __future__ import annotations

import sys
import unittest

from ...frameworks.torch.device import manual_seed


def extract_test_fn():
    """``common_utils.extract_test_fn``: the test function of the innermost frame whose
    ``self`` is a ``unittest.TestCase`` running a ``test*`` method, else None."""
    frame = sys._getframe(1)
    while frame is not None:
        self_val = frame.f_locals.get("self")
        if isinstance(self_val, unittest.TestCase):
            try:
                *_, cls_name, test_name = self_val.id().rsplit(".", 2)
                if cls_name == type(self_val).__name__ and test_name.startswith("test"):
                    return getattr(self_val, test_name).__func__
            except Exception:        # as PyTorch's: any surprise means "not found"
                return None
        frame = frame.f_back
    return None


def install() -> None:
    """Use :func:`extract_test_fn` wherever PyTorch's harness calls its own."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core
    common_utils.extract_test_fn = extract_test_fn
    core.extract_test_fn = extract_test_fn


#: seed the generator fornax's random ops draw from (the host's default generator)
seed = manual_seed
