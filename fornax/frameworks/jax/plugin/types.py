"""The types of a StableHLO program as numpy sees them, and the error for a program the
plugin cannot read."""

from __future__ import annotations

import re

import jax
import numpy as np
from jaxlib.mlir import ir

from . import capi
from .table import PjrtError


class Unsupported(PjrtError):
    """A StableHLO op the plugin cannot run."""

    def __init__(self, message: str, **kw):
        super().__init__(message, capi.UNIMPLEMENTED, **kw)


def np_dtype(t) -> np.dtype:
    """The numpy dtype of an MLIR element type."""
    s = str(t)
    if s == "i1":
        return np.dtype(bool)
    m = re.fullmatch(r"(u?)i(\d+)", s) or re.fullmatch(r"(ui)(\d+)", s)
    if m:
        return np.dtype(("uint" if m.group(1) else "int") + m.group(2))
    if s in ("f16", "f32", "f64"):
        return np.dtype("float" + s[1:])
    if s == "bf16":
        return np.dtype(jax.numpy.bfloat16)
    raise Unsupported(f"element type {s} has no fornax device dtype")


def tensor(t) -> tuple[tuple[int, ...], np.dtype]:
    rt = ir.RankedTensorType(t)
    if not rt.has_static_shape:
        raise Unsupported(f"{t}: dynamic shapes are not supported")
    return tuple(rt.shape), np_dtype(rt.element_type)
