"""The machinery of a conformance suite: its clauses by seam, the subject and the runner.

A seam's suite is the list of clauses registered for it with :func:`clause`; each clause
is run by :func:`run_clause` on a fresh :class:`Subject` (the implementation under test on
fresh simulated devices).  The suites themselves are the modules named after the seams;
:mod:`fornax.contracts.suites` loads them all and runs one by seam name.
"""

from __future__ import annotations

import importlib
import traceback
from typing import Callable

import numpy as np

from ..layers.compiler import Target
from ..layers.errors import ConfigError, FornaxError
from ..layers.graph import DType, Graph
from ..layers.vendor import Vendor
from ..sim.device import Device
from ..sim.spec import load_spec
from ..sim.topology import Topology
from .clause import Clause, ContractFailure, Result, evaluate

__all__ = ["SUITES", "Clause", "ContractFailure", "Result", "Subject", "add_relu_graph", "clause",
           "expect_error", "require", "resolve_impl", "rng_arrays", "run_clause"]


#: every seam's suite, in the order its clauses were declared
SUITES: dict[str, list[Clause["Subject"]]] = {}

Check = Callable[["Subject"], None]


def clause(seam: str, cid: str, title: str) -> Callable[[Check], Check]:
    """Register a check as a clause of ``seam``'s suite."""
    def register(fn: Check) -> Check:
        SUITES.setdefault(seam, []).append(Clause(seam, cid, title, fn))
        return fn
    return register


class Subject:
    """The implementation under test, given fresh simulated devices for each clause."""

    SPEC = "tiny"
    DEVICES = 2

    def __init__(self, vendor: Vendor):
        self.vendor = vendor
        self.spec = load_spec(self.SPEC)
        self.devices = [Device(self.spec, i) for i in range(self.DEVICES)]
        self._driver = None

    def driver(self):
        if self._driver is None:
            self._driver = self.vendor.driver(self.devices)
        return self._driver

    def runtime(self):
        return self.vendor.runtime(self.driver())

    def connect(self, kind: str = "switch") -> Topology:
        """Join the subject's devices by a fabric, as a composed stack does (once)."""
        if self.devices[0].topology is None:
            Topology.build(self.spec, len(self.devices), kind).connect(self.devices)
        topology = self.devices[0].topology
        if topology is None:
            raise ContractFailure("the fabric joined no device")
        return topology

    def communicator(self, library, timeout_s: float | None = None):
        """``library``'s communicator over every device of the subject, joined by a fabric."""
        self.connect()
        return library.communicator(None, timeout_s)

    def binaries(self, graph: Graph):
        """The family's compiler output for ``graph``, one per format the driver loads."""
        drv = self.driver()
        props = drv.properties(0)
        compiler = self.vendor.compiler()
        loadable = set(drv.loadable_formats(0))
        out = []
        for fmt in compiler.output_formats():
            if fmt in loadable:
                plan = compiler.compile(graph, Target(props.target, fmt, props.compute_units))
                out.append(plan)
        if not out:
            raise ContractFailure(f"the family's compiler emits {compiler.output_formats()}, none of which "
                                  f"the driver loads ({sorted(loadable)})")
        return out


def add_relu_graph(n: int = 300) -> Graph:
    """out = relu(a + b): one pointwise kernel with inputs in0, in1 and output out0."""
    g = Graph("conform_add_relu")
    a = g.input("a", (n,), DType.FLOAT32)
    b = g.input("b", (n,), DType.FLOAT32)
    g.output(g.op("relu", g.op("add", a, b)), names=["out"])
    return g


def expect_error(fn: Callable[[], object], what: str, kinds: tuple[type[FornaxError], ...] = (FornaxError,)) -> FornaxError:
    """``fn`` must raise a fornax error of ``kinds`` that carries the vendor's exact code."""
    try:
        fn()
    except kinds as exc:
        if getattr(exc, "code", None) is None:
            raise ContractFailure(f"{what}: raised {type(exc).__name__} without a vendor error code "
                                  f"({exc})") from None
        return exc
    except FornaxError as exc:
        raise ContractFailure(f"{what}: raised {type(exc).__name__} ({exc}), expected "
                              f"{' or '.join(k.__name__ for k in kinds)}") from None
    raise ContractFailure(f"{what}: no error was raised")


def require(condition: object, message: str) -> None:
    """The clause fails with ``message`` unless ``condition`` is truthy."""
    if not condition:
        raise ContractFailure(message)


def rng_arrays(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32))


def resolve_impl(ref: str) -> Vendor:
    """``package.module:attr`` -> a Vendor (or a zero-argument factory of one)."""
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"--impl takes package.module:attribute, got {ref!r}")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        if callable(obj) and not isinstance(obj, Vendor):
            obj = obj()
    except Exception as exc:  # a broken implementation must not crash the suite
        raise ConfigError(f"cannot load implementation {ref}: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, Vendor):
        raise ConfigError(f"{ref} is a {type(obj).__name__}, not a fornax Vendor")
    return obj


def _explain(exc: Exception) -> tuple[str, str | None]:
    """A suite's words for an exception a clause raised (a crash names where it happened)."""
    if isinstance(exc, ContractFailure):
        return str(exc), None
    if isinstance(exc, FornaxError):
        return f"unexpected {type(exc).__name__}: {exc}", None
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return (f"crashed with {type(exc).__name__}: {exc} "
            f"(at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"), None


def run_clause(c: Clause[Subject], vendor: Vendor) -> Result:
    """Run one clause of a suite on ``vendor`` (on fresh devices); never raises for the
    implementation's sake: a broken promise or a crash is a failed result."""
    return evaluate(c, Subject(vendor), _explain)
