"""The neural-network ops' public helpers under their former module name.

The ops themselves (``dot_general``, convolution, indexing, RNG, norms,
attention) are registered by their families in :mod:`fornax.layers.ops`
(``linalg``, ``convolution``, ``indexing``, ``rng``, ``normalization``,
``attention``) whenever :mod:`fornax.layers.graph` is imported.  This module
re-exports the names other layers use: the Threefry constants and hash, the
convolution and im2col geometry, and the im2col-plus-matmul convolution a
front end may build directly (with their former underscore names too).
"""

from __future__ import annotations

from .ops.convolution import conv_geometry, conv_via_im2col, im2col_geometry
from .ops.indexing import INDEX_DTYPES
from .ops.rng import MASK32, RANDOM_DTYPES, THREEFRY_PARITY, THREEFRY_ROTATIONS, threefry2x32

#: former private names, kept for existing importers
_conv_geometry = conv_geometry
_im2col_geometry = im2col_geometry
_conv_via_im2col = conv_via_im2col

__all__ = ["MASK32", "THREEFRY_ROTATIONS", "THREEFRY_PARITY", "INDEX_DTYPES", "RANDOM_DTYPES",
           "threefry2x32", "conv_geometry", "im2col_geometry", "conv_via_im2col"]
