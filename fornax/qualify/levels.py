"""The eight support levels, the limits their evidence is held to, and the evidence registry.

Each level is a promise a user of the stack relies on; its evidence is the clauses
registered for it with :func:`evidence` (one module per level, ``l0_device`` ..
``l7_failures``), run in the order they were declared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..contracts.clause import Clause, Measure, Outcome
from ..layers.errors import ConfigError
from .subject import StackSubject

SCHEMA = "fornax.qualify/1"

#: a level passes L2 when at least this share of the OpInfo samples pass
OPINFO_THRESHOLD = 0.95
#: the OpInfos L2 runs (a fixed, named subset of ``fornax.frameworks.torch.opinfo.TOP_OPS``:
#: elementwise math, a comparison-driven select, reductions, matrix products, the layers and
#: losses of the L3/L4 models, a view and a concatenation)
OPINFO_OPS: tuple[str, ...] = (
    "add", "mul", "div.no_rounding_mode", "exp", "tanh", "sigmoid", "where", "sum", "mean", "amax",
    "matmul", "nn.functional.linear", "nn.functional.conv2d", "nn.functional.relu",
    "nn.functional.gelu", "softmax", "nn.functional.layer_norm", "nn.functional.cross_entropy",
    "transpose", "cat",
)
#: samples per OpInfo (the first ones ``sample_inputs`` yields)
OPINFO_SAMPLES = 3

#: normwise relative error limits, ``max|got - ref| / max|ref|``: float32 work against a
#: CPU float32 run or a float64 reference (a few float32 roundings, far below the ~1e-3 a
#: silent bfloat16 or TF32 downgrade gives), and one rounding to a 16-bit float with float32
#: accumulation (2^-11 for float16, 2^-8 for bfloat16, doubled)
TOL = {"float32": 1e-5, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


@dataclass(frozen=True)
class Level:
    id: str
    title: str
    promise: str


LEVELS: tuple[Level, ...] = (
    Level("L0", "device discovered",
          "the driver enumerates the device and describes it; PyTorch (torch.fornax) and JAX "
          "see it in the family's vocabulary; the installed package registers it on `import torch`"),
    Level("L1", "allocation, copies, views",
          "tensors go to the device and back bit-exactly; views, strides and in-place writes "
          "through views keep PyTorch semantics; memory statistics follow allocations"),
    Level("L2", "operator coverage",
          f"PyTorch's OpInfo samples of {len(OPINFO_OPS)} named operators match CPU eager on "
          f"at least {OPINFO_THRESHOLD:.0%} of samples, and PyTorch's whole OpInfo database "
          "through its device-generic harness meets the per-dtype targets with every remaining "
          "failure listed with its reason (a deterministic sample; everything with --full)"),
    Level("L3", "autograd",
          "an MLP and a small CNN train-step (forward and backward) on the device match CPU eager; "
          "PyTorch's ModuleInfos pass; eight real transformers architectures' forward and "
          "every gradient match CPU"),
    Level("L4", "compile",
          "torch.compile(backend='fornax') forward+backward matches eager CPU (an MLP and the "
          "real models), and fornax.frameworks.jax.jit of an MLP's value and gradient and of "
          "equinox/optax programs matches jax.jit"),
    Level("L5", "numerics and autocast",
          "float32 results are within float32 tolerance of float64 references; "
          "torch.autocast('fornax') runs a matmul in the family's policy dtype; bfloat16 "
          "within bfloat16 tolerance; PyTorch's OptimInfos step as on CPU; the real models train "
          "(AdamW) and generate as on CPU"),
    Level("L6", "distributed",
          "the stack composed with two devices: the library's all-reduce gives the sum; the "
          "framework face names the distributed backend"),
    Level("L7", "failure handling",
          "an injected device fault and an out-of-memory give a clear error with the family's "
          "vendor code and a hint, and the process keeps working; a bad config is a one-line "
          "error; torch.profiler shows each op's device time"),
)
LEVEL_IDS = tuple(lv.id for lv in LEVELS)


def normalize_level(text: object) -> str:
    """``"L3"``, ``"l3"`` or ``"3"`` -> ``"L3"``; anything else is a ConfigError."""
    s = str(text).strip().upper()
    if not s.startswith("L"):
        s = "L" + s
    if s not in LEVEL_IDS:
        raise ConfigError(f"unknown level {text!r}; levels: {', '.join(LEVEL_IDS)}")
    return s


#: a piece of evidence: measures the stack under test and says how it went
Check = Callable[[StackSubject], Outcome]

#: every level's evidence, by level id, in the order it was declared
EVIDENCE: dict[str, list[Clause[StackSubject]]] = {}


def evidence(level: str, name: str, title: str, *, seam: str | None, measured: str, relation: str,
             limit: float | int | str | None, dtype: str | None = None,
             shape: str | None = None) -> Callable[[Check], Check]:
    """Register the decorated ``fn(subject) -> Outcome`` as evidence of ``level``: a clause
    of the stack's ``seam`` (None: the stack as a whole) with what it measures."""
    def register(fn: Check) -> Check:
        EVIDENCE.setdefault(level, []).append(
            Clause(seam, name, title, fn, level, Measure(measured, relation, limit, dtype, shape)))
        return fn
    return register
