"""The stack behind ``torch.device("fornax")``: which composed stack runs the ops, and
what each op cost and where it went.

One :class:`Session` is active per process.  It is composed lazily on first use from
``fornax.frameworks.torch.use_stack(...)`` if that was called, else from the
``FORNAX_CONFIG`` (a stack TOML file) or ``FORNAX_VENDOR`` (a vendor family for every
seam) environment variables, else cuda-like on the default chip.

A tensor's data pointer is the simulated device address of its bytes, tagged in the
high bits with the id of the session that allocated it (``ptr = session_id << 52 |
address``).  Switching stacks with :func:`use_stack` leaves tensors of the old stack
alive and freeable; using one with the new stack is a clear error instead of a read
of another stack's memory.
"""

from __future__ import annotations

import os
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ...layers.errors import ConfigError, FornaxError
from ...stack import Stack, compose, load_config, make_config
from .stream_selection import Selectable, runtime_stream

TAG_SHIFT = 52
#: packets of history each device's timeline keeps for traces (its oldest half goes past this)
RECORD_LIMIT = 100_000
ADDRESS_MASK = (1 << TAG_SHIFT) - 1


class DeviceError(FornaxError):
    """A fornax tensor was used in a way its device cannot honour."""

    kind = "device"


@dataclass
class OpStats:
    """Per-ATen-op accounting: how often it ran by each route, and why it fell back."""

    routes: Counter = field(default_factory=Counter)        # (op, kind) -> calls
    reasons: dict = field(default_factory=dict)             # (op, kind) -> reason

    last: str = ""                                          # the route of the latest call

    last_key: tuple = ()

    def record(self, op: str, kind: str, reason: str = "") -> None:
        self.last = kind
        self.last_key = (op, kind)
        self.routes[(op, kind)] += 1
        if reason and (op, kind) not in self.reasons:
            self.reasons[(op, kind)] = reason

    def relabel_last(self, op: str, reason: str = "") -> None:
        """Count the latest call under ``op`` instead (an in-place or out= op that ran as its
        functional twin is one call, of the op the program made)."""
        if not self.last_key:
            return
        old, kind = self.last_key
        self.routes[(old, kind)] -= 1
        if not self.routes[(old, kind)]:
            del self.routes[(old, kind)]
        self.record(op, kind, reason)

    def rows(self, kind: str | None = None) -> list[dict]:
        out = [{"op": op, "route": k, "count": n, "reason": self.reasons.get((op, k), "")}
               for (op, k), n in self.routes.items() if kind is None or k == kind]
        return sorted(out, key=lambda r: (-r["count"], r["op"]))

    def totals(self) -> dict:
        t: Counter[str] = Counter()
        for (_, k), n in self.routes.items():
            t[k] += n
        return dict(t)


class Session:
    """One composed stack serving the ``fornax`` device."""

    _next_id = 1

    def __init__(self, stack: Stack, origin: str):
        if Session._next_id >= 1 << (63 - TAG_SHIFT):
            raise ConfigError("too many fornax stacks were composed in this process")
        self.id = Session._next_id
        Session._next_id += 1
        self.stack = stack
        self.origin = origin
        self.runtime = stack.runtime
        self.framework = stack.framework
        self.lock = threading.RLock()       # storages die on any thread (the autograd engine's too)
        self.allocations: dict[int, int] = {}   # device address -> bytes
        self.stats = OpStats()
        self.plans: OrderedDict = OrderedDict()  # eager executables, keyed by op signature
        self.fast: dict = {}                    # the dispatch cache: call signature -> launch
        self.rules: dict = {}                   # ATen op -> the family's torch_route answer
        self.alive = True
        self.default_torch_stream: Selectable | None = None   # torch.fornax.default_stream()'s object
        self.resets: dict[int, str] = {}        # session ids retired by a device reset -> why
        #: work still pending on storages (data pointer -> (event, tensors kept)): see .hazards
        self.deferred: dict[int, tuple[Any, list]] = {}
        for device in getattr(stack, "devices", ()):  # an eager process runs millions of packets
            device.timeline.record_limit = RECORD_LIMIT
        log = getattr(getattr(stack, "driver", None), "kernel_log", None)
        if log is not None and hasattr(log, "limit"):
            log.limit = RECORD_LIMIT

    # -- addresses ----------------------------------------------------------------------------
    def tag(self, address: int) -> int:
        return (self.id << TAG_SHIFT) | address

    def malloc(self, nbytes: int, stream: Any = None) -> int:
        """Device bytes from the runtime seam's caching allocator, on ``stream``'s pool (default:
        the current stream's; like PyTorch's, it never synchronises the device)."""
        with self.lock:
            address = self.runtime.allocate(max(int(nbytes), 1),
                                            runtime_stream(self) if stream is None else stream)
            self.allocations[address] = int(nbytes)
            return self.tag(address)

    def free(self, ptr: int) -> None:
        with self.lock:
            if ptr >> TAG_SHIFT != self.id:
                return                 # allocated before a device reset: gone with the context
            address = ptr & ADDRESS_MASK
            if self.allocations.pop(address, None) is not None:
                self.runtime.deallocate(address)

    def reset_device(self, reason: str = "a device reset") -> None:
        """Reset the device under this session after an error left it unusable (a sticky
        context, a lost device): the runtime seam destroys its context and everything in it
        (``device_reset``), the session forgets its executables and takes a new id, so every
        tensor made before is a clear error when used (recompute it, or reload it from a
        checkpoint) and is dropped without a free when it dies."""
        with self.lock:
            self.deferred = {}                 # deferred work dies with the context
            self.runtime.device_reset(0)
            self.resets[self.id] = reason
            if Session._next_id >= 1 << (63 - TAG_SHIFT):
                raise ConfigError("too many fornax device resets in this process")
            self.id = Session._next_id
            Session._next_id += 1
            self.allocations = {}
            self.plans.clear()
            self.fast.clear()

    def address(self, ptr: int, what: str = "tensor") -> int:
        """The simulated device address behind a tagged data pointer of this session."""
        sid = ptr >> TAG_SHIFT
        if sid in self.resets:
            raise DeviceError(
                f"this {what}'s device memory was destroyed when the device was reset after "
                f"{self.resets[sid]}", seam="framework", vendor=self.framework.vendor,
                hint="recompute it, or reload it from a checkpoint (tensors kept on the CPU "
                     "survive a reset)")
        if sid != self.id:
            raise DeviceError(
                f"this {what} was allocated on a previous fornax stack (session {sid}); the device "
                f"now runs session {self.id} ({self.describe()})", seam="framework",
                vendor=self.framework.vendor,
                hint="move tensors to the CPU (.cpu()) before switching stacks with use_stack(), "
                     "and back with .to('fornax') after")
        return ptr & ADDRESS_MASK

    def describe(self) -> str:
        return self.stack.describe()

    def report(self) -> dict:
        """What the torch front end did on this stack: routes per op and fallbacks with reasons."""
        return {"session": self.id, "stack": self.describe(), "origin": self.origin,
                "totals": self.stats.totals(), "ops": self.stats.rows(),
                "fallbacks": self.stats.rows("fallback"),
                "live_allocations": len(self.allocations),
                "live_bytes": sum(self.allocations.values())}


_lock = threading.Lock()
_current: Session | None = None
_hooks: list = []


def on_session(fn) -> None:
    """Call ``fn(session)`` whenever a session becomes active (registration of per-stack
    policies such as autocast)."""
    _hooks.append(fn)


def _activate(session: Session) -> Session:
    global _current
    _current = session
    for fn in _hooks:
        fn(session)
    return session


def use_stack(vendor: str | None = None, *, config: str | None = None, spec: str | None = None,
              seams: dict[str, str] | None = None, stack: Stack | None = None,
              replay: bool | None = None) -> Session:
    """Compose the stack the ``fornax`` device runs on (all seams from ``vendor``, a TOML
    ``config`` file, per-seam overrides, a chip ``spec``) or adopt a composed ``stack``;
    ``replay=False`` runs every kernel launch through the interpreter (the same results).

    Call it before the first fornax tensor is made; calling it later switches stacks for
    new tensors (tensors of the old stack must be moved to the CPU first)."""
    if stack is None:
        base = load_config(config) if config else None
        if vendor is None and base is None and not seams:
            raise ConfigError("use_stack() needs a vendor, a config file, seams or a stack",
                              hint="e.g. use_stack('rocm-like') or use_stack(config='stack.toml')")
        cfg = make_config(vendor, seams, spec=spec, base=base, replay=replay)
        if cfg.meta:
            raise ConfigError("the torch eager device computes real values; a shape-only (meta) "
                              "stack cannot back it", hint="set meta = false in the config")
        stack = compose(cfg)
        origin = f"use_stack({vendor or config or seams})"
    else:
        origin = "use_stack(stack=...)"
    with _lock:
        return _activate(Session(stack, origin))


def current() -> Session:
    """The active session, composed on first use."""
    global _current
    if _current is not None:
        return _current
    with _lock:
        if _current is not None:           # another thread composed it meanwhile
            return _current
        config = os.environ.get("FORNAX_CONFIG")
        vendor = os.environ.get("FORNAX_VENDOR")
        if config:
            cfg, origin = make_config(vendor, base=load_config(config)), f"FORNAX_CONFIG={config}"
        else:
            cfg = make_config(vendor or "cuda-like")
            origin = f"FORNAX_VENDOR={vendor}" if vendor else "default (cuda-like)"
        if cfg.meta:
            raise ConfigError(f"{origin}: a shape-only (meta) stack cannot back the torch "
                              "eager device", hint="set meta = false in the config")
        return _activate(Session(compose(cfg), origin))


def initialized() -> bool:
    return _current is not None
