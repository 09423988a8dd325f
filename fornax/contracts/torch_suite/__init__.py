"""PyTorch's own test machinery on the fornax device: OpInfos, ModuleInfos, OptimInfos.

The suite's test modules (:mod:`.ops_suite`, :mod:`.modules_suite`, :mod:`.optims_suite`)
are written on PyTorch's device-generic harness (``@ops(op_db)``, ``@modules(module_db)``,
``@optims(optim_db)``, ``instantiate_device_type_tests(..., only_for="fornax")``) and compare
every check with the CPU.  What a family does differently is data: its known-failure table
(:mod:`.known`, ``known_failures/<family>.toml``); an entry that starts passing is stale and
fails the run.  :func:`run_suite` runs the modules in pytest subprocesses and returns the
pass rates per kind and dtype (:class:`SuiteResult`).
"""

from __future__ import annotations

from .result import SuiteResult
from .runner import run_suite

__all__ = ["SuiteResult", "run_suite"]
