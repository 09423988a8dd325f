"""Faults the simulated hardware raises.

These are hardware-level conditions (a page fault, an exhausted HBM, a hang).
The simulator knows nothing of vendors or of fornax's error hierarchy: the
driver seam catches these and maps them onto its family's error codes.
"""

from __future__ import annotations


class SimError(Exception):
    """Base of every condition the simulated device reports."""

    kind = "sim_error"


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
    """The watchdog fired: a wait can never be satisfied by the work submitted."""

    kind = "hang"


class ExecutionError(SimError):
    """A kernel asked the executor for something it cannot do (bad operand shapes, ...)."""

    kind = "execution_error"
