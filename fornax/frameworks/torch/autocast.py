"""``torch.autocast("fornax")`` with the active stack's autocast policy.

The framework seam of each family says, per ATen overload, what autocast does
(:class:`fornax.layers.face.AutocastPolicy`: torch's CastPolicy names).  Kernels are
registered on the ``AutocastPrivateUse1`` key for every op some session's policy
names; at call time each looks up the *current* stack's policy, so switching stacks
switches policies.  Every other op falls through the key.  When a session starts, its
family's default autocast dtype becomes ``torch.get_autocast_dtype("fornax")``.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

from . import session as _session

KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, KEY))  # a key torch's stubs omit
_registered: set[str] = set()
_libraries: list | None = None
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def register(libraries: list) -> None:
    """Fall through the autocast key by default; add kernels as sessions bring policies."""
    global _libraries
    _libraries = libraries
    lib = torch.library.Library("_", "IMPL")
    libraries.append(lib)
    lib.fallback(torch.library.fallthrough_kernel, KEY)
    _session.on_session(_adopt)
    if _session.initialized():
        _adopt(_session.current())


def _adopt(session) -> None:
    policy = session.framework.autocast_policy()
    torch.set_autocast_dtype("fornax", _DTYPES[policy.default_dtype])
    lib = None
    for name in sorted(policy.casts):
        if name in _registered:
            continue
        op = _resolve(name)
        if op is None:
            continue
        if lib is None:
            lib = torch.library.Library("aten", "IMPL")
            assert _libraries is not None, "register() runs before any session is adopted"
            _libraries.append(lib)
        lib.impl(name, _kernel(op, name), KEY)
        _registered.add(name)


def _resolve(name: str):
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def _eligible(x) -> bool:
    return (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64
            and x.device.type == "fornax")


def _kernel(op, name: str):
    def kernel(*args, **kwargs):
        policy = _session.current().framework.autocast_policy().cast(name)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            if policy == "lower_precision_fp":
                dtype = torch.get_autocast_dtype("fornax")
                args, kwargs = tree_map(lambda x: x.to(dtype) if _eligible(x) else x, (args, kwargs))
            elif policy in ("fp32", "fp32_append_dtype"):
                args, kwargs = tree_map(lambda x: x.float() if _eligible(x) else x, (args, kwargs))
            elif policy == "fp32_set_opt_dtype":
                flat = [x for x in list(args) + list(kwargs.values()) if _eligible(x)]
                if flat and kwargs.get("dtype") is None and "dtype" in [a.name for a in op._schema.arguments]:
                    kwargs = dict(kwargs, dtype=torch.float32)
            elif policy == "promote":
                floats = [x.dtype for x in list(args) + list(kwargs.values()) if _eligible(x)]
                if floats:
                    wide = floats[0]
                    for d in floats[1:]:
                        wide = torch.promote_types(wide, d)
                    args, kwargs = tree_map(lambda x: x.to(wide) if _eligible(x) else x, (args, kwargs))
            elif policy == "banned":
                raise RuntimeError(
                    f"torch.{name.split('.')[0]} and torch.nn.functional.{name.split('.')[0]} are "
                    "unsafe to autocast. Many models use a sigmoid layer right before the binary "
                    "cross entropy layer; use binary_cross_entropy_with_logits, which is safe to "
                    "autocast.")
            return op(*args, **kwargs)
    return kernel
