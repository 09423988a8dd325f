"""Faults the simulated hardware raises, and deterministic fault injection.

These are hardware-level conditions (a page fault, an exhausted HBM, a hang,
an ECC error, a failed link, a lost device).  The simulator knows nothing of
vendors or of fornax's error hierarchy: the driver seam catches these and maps
them onto its family's error codes by their ``kind``.

A :class:`FaultPlan` is a seeded list of :class:`FaultSpec`; attached to a
device (``Device.inject(plan)``) it becomes a :class:`FaultInjector` that the
device consults at the start of every kernel, copy and peer transfer.  The
same plan on the same sequence of operations gives the same faults every run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np


class SimError(Exception):
    """Base of every condition the simulated device reports."""

    kind = "sim_error"
    #: False for an error the hardware could not contain to the partition it hit
    #: (``fornax.sim.chip``); a device that is not partitioned is its own containment
    contained = True


class SpecError(SimError):
    """A chip spec file is missing, malformed or incomplete."""

    kind = "spec_error"


class InvalidProgram(SimError):
    """A tile-ISA program is malformed (decode or verification failed)."""

    kind = "invalid_program"


class PageFault(SimError):
    """An access touched an address that no live mapping of this context covers."""

    kind = "page_fault"

    def __init__(self, address: int, access: str, context: int, detail: str):
        self.address = address
        self.access = access
        self.context = context
        self.detail = detail
        super().__init__(
            f"page fault: {access} of address {address:#x} in context {context}: {detail}"
        )


class MisalignedAddress(PageFault):
    kind = "misaligned_address"


class OutOfDeviceMemory(SimError):
    """Device memory (HBM) cannot back a new mapping."""

    kind = "out_of_memory"

    def __init__(self, requested: int, used: int, capacity: int):
        self.requested = requested
        self.used = used
        self.capacity = capacity
        super().__init__(
            f"out of device memory: requested {requested} bytes with {used} of "
            f"{capacity} bytes in use ({capacity - used} free)"
        )


class DeviceHang(SimError):
    """The watchdog fired: a wait can never be satisfied by the work submitted,
    or a kernel ran past the watchdog timeout (``elapsed_s`` of simulated time)."""

    kind = "hang"

    def __init__(self, message: str, elapsed_s: float = 0.0):
        self.elapsed_s = elapsed_s
        super().__init__(message)


class ExecutionError(SimError):
    """A kernel asked the executor for something it cannot do (bad operand shapes, ...)."""

    kind = "execution_error"


class EccUncorrectable(SimError):
    """An uncorrectable (multi-bit) ECC error: the operation's data cannot be trusted."""

    kind = "ecc_uncorrectable"


class LinkFailure(SimError):
    """A transfer failed because the link carrying it (host or peer link) failed."""

    kind = "link_failure"


class DeviceLost(SimError):
    """The device is gone (fell off the bus): every operation on it fails until it is reset."""

    kind = "device_lost"


class FaultPlanError(SimError):
    """A fault plan or fault spec is malformed."""

    kind = "fault_plan"


# -- injection ------------------------------------------------------------------------------
#: fault kinds, what each does, the operations it may hit and the one it hits by default
FAULT_KINDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "ecc_correctable": ("a single-bit ECC error, corrected: counted, the work completes",
                        ("kernel", "copy", "peer"), "kernel"),
    "ecc_uncorrectable": ("a multi-bit ECC error: the operation fails",
                          ("kernel", "copy", "peer"), "kernel"),
    "page_fault": ("the kernel faults at a named address", ("kernel",), "kernel"),
    "hang": ("the kernel never completes; the watchdog fires after watchdog_s",
             ("kernel",), "kernel"),
    "link_failure": ("the link carrying a transfer fails: the copy fails",
                     ("copy", "peer"), "copy"),
    "device_lost": ("the device is gone: this and every later operation fail until reset",
                    ("kernel", "copy", "peer"), "kernel"),
}

#: operations the device reports to an injector; a peer transfer also counts as a copy
OPERATIONS = ("kernel", "copy", "peer")


@dataclass(frozen=True)
class FaultSpec:
    """One fault: its ``kind`` and its trigger.

    The trigger is either ``at`` (the fault hits the ``at``-th operation of kind
    ``op`` on the device, counting from 1, once) or ``probability`` (each such
    operation is hit with that probability, drawn from the plan's seeded
    generator).  ``op`` defaults per kind (``kernel``; ``copy`` for
    ``link_failure``).  ``address`` is where a ``page_fault`` faults (default
    0, a null-pointer access).  ``contained`` False makes an error the hardware could not
    contain to the partition it hit (on a partitioned chip it lands where the mode's
    ``uncontained`` says: ``fornax.sim.partition``).
    """

    kind: str
    at: int | None = None
    probability: float | None = None
    op: str | None = None
    address: int = 0
    contained: bool = True

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise FaultPlanError(f"unknown fault kind {self.kind!r}; choose one of: "
                                 f"{', '.join(FAULT_KINDS)}")
        _, ops, default = FAULT_KINDS[self.kind]
        if self.op is None:
            object.__setattr__(self, "op", default)
        if self.op not in ops:
            raise FaultPlanError(f"fault {self.kind!r} cannot hit a {self.op!r} operation "
                                 f"(it hits {', '.join(ops)})")
        if (self.at is None) == (self.probability is None):
            raise FaultPlanError(f"fault {self.kind!r} needs exactly one trigger: at=N "
                                 "(the Nth operation) or probability=P")
        if self.at is not None and (isinstance(self.at, bool) or not isinstance(self.at, int)
                                    or self.at < 1):
            raise FaultPlanError(f"fault {self.kind!r}: at must be a whole number >= 1 "
                                 f"(the Nth {self.op}), got {self.at!r}")
        if self.probability is not None and not (
                isinstance(self.probability, (int, float)) and 0.0 <= self.probability <= 1.0):
            raise FaultPlanError(f"fault {self.kind!r}: probability must be in [0, 1], "
                                 f"got {self.probability!r}")
        if not isinstance(self.contained, bool):
            raise FaultPlanError(f"fault {self.kind!r}: contained must be true or false, "
                                 f"got {self.contained!r}")
        if isinstance(self.address, bool) or not isinstance(self.address, int) or self.address < 0:
            raise FaultPlanError(f"fault {self.kind!r}: address must be a non-negative integer, "
                                 f"got {self.address!r}")

    def describe(self) -> str:
        when = f"{self.op} #{self.at}" if self.at is not None else f"p={self.probability} per {self.op}"
        return f"{self.kind}@{when}"


_SPEC_TEXT = re.compile(r"^([a-z_]+)(?:@(\d+))?$")


@dataclass(frozen=True)
class FaultPlan:
    """A seeded list of faults.  ``watchdog_s`` is the simulated time a hung
    kernel runs before the watchdog fires (two seconds, like the default
    display-driver timeout)."""

    faults: tuple[FaultSpec, ...] = ()
    seed: int = 0
    watchdog_s: float = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", tuple(self.faults))
        for f in self.faults:
            if not isinstance(f, FaultSpec):
                raise FaultPlanError(f"a fault plan holds FaultSpec entries, got {f!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise FaultPlanError(f"fault plan seed must be a non-negative integer, got {self.seed!r}")
        if not isinstance(self.watchdog_s, (int, float)) or not self.watchdog_s > 0:
            raise FaultPlanError(f"watchdog_s must be a positive number of seconds, "
                                 f"got {self.watchdog_s!r}")

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> "FaultPlan":
        """``KIND[@N]`` items separated by commas, e.g. ``hang@2,ecc_correctable``
        (``@N``: the Nth operation the kind hits by default; no ``@N`` means the first)."""
        specs = []
        for item in (p.strip() for p in str(text).split(",")):
            m = _SPEC_TEXT.match(item)
            if not m:
                raise FaultPlanError(f"cannot read fault {item!r}: write KIND or KIND@N with KIND "
                                     f"one of {', '.join(FAULT_KINDS)} and N >= 1")
            specs.append(FaultSpec(m.group(1), at=int(m.group(2) or 1)))
        return cls(tuple(specs), seed)


@dataclass
class FaultRecord:
    """One fault that fired: what, on which operation, and the operation's label."""

    kind: str
    op: str
    n: int              # the operation's number among operations of its kind on the device
    label: str


@dataclass
class FaultInjector:
    """A plan attached to one device: counts its operations and decides the faults.

    Probabilities are drawn from ``numpy.random.default_rng([seed, device])``,
    one draw per probabilistic spec per matching operation, so the faults depend
    only on the plan, the device index and the sequence of operations.
    """

    plan: FaultPlan
    device: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OPERATIONS, 0))
    log: list[FaultRecord] = field(default_factory=list)
    ecc_corrected: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng([self.plan.seed, self.device])

    def next(self, op: str, label: str, context: int = 0) -> SimError | None:
        """Count one ``op`` and return the fault to raise for it (None: it runs).

        Correctable ECC errors that fire are counted in ``ecc_corrected`` and
        never stop the operation; of the failing faults the first in plan order wins.
        """
        ops = ("copy", "peer") if op == "peer" else (op,)
        for o in ops:
            self.counts[o] += 1
        failure: SimError | None = None
        for spec in self.plan.faults:
            hits = spec.op             # set by FaultSpec.__post_init__
            if hits is None or hits not in ops:
                continue
            n = self.counts[hits]
            if spec.at is not None:
                hit = n == spec.at
            else:
                hit = spec.probability is not None and bool(self.rng.random() < spec.probability)
            if not hit:
                continue
            self.log.append(FaultRecord(spec.kind, hits, n, label))
            if spec.kind == "ecc_correctable":
                self.ecc_corrected += 1
            elif failure is None:
                failure = self._fault(spec, n, label, context)
                failure.contained = spec.contained
        return failure

    def _fault(self, spec: FaultSpec, n: int, label: str, context: int) -> SimError:
        where = f"{spec.op} #{n} ({label}) on device {self.device}"
        if spec.kind == "ecc_uncorrectable":
            return EccUncorrectable(f"uncorrectable ECC error in device memory during {where}")
        if spec.kind == "page_fault":
            return PageFault(spec.address, "read", context,
                             f"injected page fault during {where}")
        if spec.kind == "hang":
            return DeviceHang(f"watchdog: {where} did not complete within "
                              f"{self.plan.watchdog_s:g} s of simulated time",
                              elapsed_s=float(self.plan.watchdog_s))
        if spec.kind == "link_failure":
            return LinkFailure(f"link failure: the link carrying {where} failed")
        return DeviceLost(f"device {self.device} was lost during {where}; "
                          "it is unusable until reset")
