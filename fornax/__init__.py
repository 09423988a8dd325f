"""fornax: a comparative accelerator software stack on a simulated device."""

__version__ = "0.1.0"
