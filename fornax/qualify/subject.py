"""The subject of a qualification: the stack under test, composed once.

Conformance checks a vendor on fresh simulated devices (:class:`fornax.contracts.base.Subject`);
a qualification checks one composed stack through its front ends, so its evidence runs on
this subject instead.  A stack that does not compose fails every piece of evidence with the
composition error: the question "does it support PyTorch" then has its answer at L0.
"""

from __future__ import annotations

import platform
from importlib import metadata
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

import fornax

from ..layers.errors import ConfigError, FornaxError
from ..stack import Stack, StackConfig, compose, describe_seams, make_config

if TYPE_CHECKING:
    from ..frameworks.torch.session import Session


def torch_fornax() -> ModuleType:
    """``torch.fornax``, the device module as a PyTorch user reaches it (PyTorch registers
    it at run time, so a type checker sees no such attribute on ``torch``)."""
    import torch
    module: ModuleType = getattr(torch, "fornax")
    return module


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


class StackSubject:
    """The stack under test.  Composed on first use (or given composed)."""

    def __init__(self, target: StackConfig | Stack):
        self.config: StackConfig
        self._stack: Stack | None
        if isinstance(target, Stack):
            self.config, self._stack = target.config, target
        else:
            self.config, self._stack = target, None
        self._error: FornaxError | None = None
        self.torch_used = False
        self.full = False                # the real-client evidence whole, not sampled
        self.current = ""                # the evidence running now (``L0.driver``)
        self._error_at = ""
        #: results of PyTorch's test suite by kind, run once per qualification
        self.torch_suite: dict[str, Any] = {}
        #: the suite's kinds the levels being run read (the sample runs them together)
        self.suite_kinds: tuple[str, ...] = ()
        self.versions: dict[str, str | None] = {
            "fornax": fornax.__version__, "torch": _version("torch"), "jax": _version("jax"),
            "python": platform.python_version(), "numpy": np.__version__}

    @property
    def stack(self) -> Stack:
        if self._stack is None:
            if self._error is not None:     # the full error is on the first evidence that met it
                raise ConfigError(f"the stack did not compose (see {self._error_at})")
            try:
                self._stack = compose(self.config)
            except FornaxError as exc:
                self._error, self._error_at = exc, self.current
                raise
        return self._stack

    def describe(self) -> str:
        """:meth:`Stack.describe` of the stack under test; for a config that did not compose
        (there is no Stack to ask), its seams' families on its chip in the same words."""
        if self._stack is not None or self._error is None:
            try:
                return self.stack.describe()
            except FornaxError:
                pass
        return describe_seams(self.config.seams, self.config.spec)

    def build(self, stack: Stack | None = None) -> str:
        """The stack in words with the software versions (what each evidence row ran on)."""
        v = self.versions
        if stack is not None:
            who = stack.describe()
            n = stack.config.devices
        else:
            who, n = self.describe(), self.config.devices
        return (f"{who}{f' x {n} devices' if n > 1 else ''}; fornax {v['fornax']}, "
                f"torch {v['torch']}, jax {v['jax']}")

    def derived(self, **changes: Any) -> StackConfig:
        """A config like the subject's with ``changes`` (devices=2, ...)."""
        return make_config(base=self.config, **changes)

    def torch(self, stack: Stack | None = None) -> Session:
        """Make ``stack`` (default: the stack under test) the torch front end's active stack."""
        import fornax.frameworks.torch as ft
        from ..frameworks.torch import session as tsession
        stack = stack if stack is not None else self.stack
        self.torch_used = True
        if tsession.initialized() and tsession.current().stack is stack:
            return tsession.current()
        return ft.use_stack(stack=stack)
