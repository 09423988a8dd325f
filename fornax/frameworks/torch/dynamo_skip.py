"""fornax's own machinery on Dynamo's skip list.

The device's ATen kernels are Python functions the dispatcher calls: when a compiled region
runs an op eagerly on ``fornax`` tensors (a graph break, an RNN Dynamo leaves alone), Dynamo
would otherwise compile those frames as user code -- down into the simulator's numpy, which it
rewrites into torch ops.  :func:`skip_fornax_frames` puts the eager device's kernels, the
seams, the simulator, the vendors and the stack on the skip list; workloads written inside
fornax (``fornax.scenarios``) are not skipped.
"""

from __future__ import annotations

import importlib.util

#: fornax's own machinery: Dynamo must run it, never trace it (see :func:`skip_fornax_frames`)
_DYNAMO_SKIP = ("fornax.frameworks.torch", "fornax.layers", "fornax.sim", "fornax.vendors", "fornax.stack")


def skip_fornax_frames() -> None:
    """Put fornax's own machinery (the eager device's kernels, the seams, the simulator) on
    Dynamo's skip list (idempotent; see the module docstring)."""
    from torch._dynamo import trace_rules

    for mod in _DYNAMO_SKIP:
        spec = importlib.util.find_spec(mod)
        assert spec is not None and spec.origin is not None, mod      # fornax's own packages
        path = spec.origin.removesuffix("__init__.py")
        if path not in trace_rules.SKIP_DIRS:
            trace_rules.add(mod)
