"""How evidence measures: normwise relative error against a reference, and its wording."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch


def normwise(got: npt.ArrayLike, ref: npt.ArrayLike) -> float:
    """``max|got - ref| / max|ref|`` in float64 (inf on a shape mismatch or a NaN the
    reference does not have)."""
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if g.shape != r.shape:
        return float("inf")
    if g.size == 0:
        return 0.0
    if np.any(np.isnan(g) != np.isnan(r)):
        return float("inf")
    scale = max(float(np.nanmax(np.abs(r))), np.finfo(np.float64).tiny)
    return float(np.nanmax(np.abs(g - r)) / scale)


def as_numpy(t: torch.Tensor) -> npt.NDArray[np.float64]:
    """A tensor (on any device) as a float64 host array."""
    return t.detach().cpu().double().numpy()


def fmt(x: float) -> str:
    return f"{x:.2e}"


def worst_error(pairs: dict[str, tuple[Any, Any]]) -> tuple[float, str]:
    """The largest normwise error over named (got, ref) pairs of tensors or arrays, and its name."""
    errs = {name: normwise(as_numpy(g) if hasattr(g, "detach") else g,
                           as_numpy(r) if hasattr(r, "detach") else r)
            for name, (g, r) in pairs.items()}
    name = max(errs, key=lambda n: errs[n])
    return errs[name], name
