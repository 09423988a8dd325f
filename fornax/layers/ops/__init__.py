"""The graph IR's op set: the registry (:mod:`.registry`) and every op family, registered.

Importing this package imports each family module, so :data:`OPS` is
complete; :mod:`fornax.layers.graph` imports it, so a graph always sees
every op.  A family module imports only :mod:`.registry` (and, for a
composite built on another family's decomposition, that family):

* :mod:`.elementwise` — unary math, binary arithmetic and comparisons,
  ``where``, ``clamp``, ``cast``, ``iota``;
* :mod:`.reductions` — ``reduce_*``, ``argmax``/``argmin``, ``reduce_mean``,
  ``var``;
* :mod:`.linalg` — ``matmul``, ``dot_general``;
* :mod:`.normalization` — ``softmax``, ``log_softmax``, ``layer_norm``,
  ``rms_norm``;
* :mod:`.layout` — ``reshape``, ``transpose``, ``broadcast_to``, ``slice``,
  ``concat``, ``pad``;
* :mod:`.collective` — ``all_reduce``;
* :mod:`.convolution` — ``im2col``, ``convolution``, ``conv_transpose``;
* :mod:`.indexing` — ``gather``, ``index_select``, ``scatter``;
* :mod:`.rng` — ``random_bits``, ``random_uniform``, ``random_normal``
  (Threefry-2x32);
* :mod:`.attention` — scaled dot-product ``attention``.

A new op is one :func:`register` call in its family's module (a new
family: one module here and one import below).
"""

from __future__ import annotations

from . import (attention, collective, convolution, elementwise, indexing, layout, linalg,
               normalization, reductions, rng)
from .convolution import ConvGeometry, Im2colGeometry, conv_geometry, conv_via_im2col, im2col_geometry
from .elementwise import erf
from .indexing import INDEX_DTYPES
from .layout import pad_widths, slice_bounds
from .normalization import softmax_decompose
from .reductions import reduced_type
from .registry import (OPS, Array, Attrs, DecomposeFn, GraphBuilder, InferFn, OpDef, ReferenceFn,
                       broadcast_shape, float_only, int_tuple, is_int, norm_axis, permute,
                       promote_indices, register, reshape, same_dtype, scalar)
from .rng import MASK32, RANDOM_DTYPES, THREEFRY_PARITY, THREEFRY_ROTATIONS, threefry2x32

__all__ = [
    # the registry
    "OPS", "OpDef", "register", "promote_indices", "GraphBuilder", "Attrs", "Array", "InferFn",
    "ReferenceFn", "DecomposeFn",
    # helpers op definitions share
    "broadcast_shape", "same_dtype", "float_only", "norm_axis", "is_int", "int_tuple", "permute",
    "reshape", "scalar", "reduced_type", "softmax_decompose", "erf",
    # attribute normalisation other layers use
    "slice_bounds", "pad_widths", "conv_geometry", "im2col_geometry", "conv_via_im2col",
    "ConvGeometry", "Im2colGeometry", "INDEX_DTYPES", "RANDOM_DTYPES",
    # the random-number hash
    "threefry2x32", "MASK32", "THREEFRY_ROTATIONS", "THREEFRY_PARITY",
    # the family modules
    "attention", "collective", "convolution", "elementwise", "indexing", "layout", "linalg",
    "normalization", "reductions", "rng",
]
