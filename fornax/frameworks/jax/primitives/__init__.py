"""Lowering rules of jax's core primitives, one module per family:

* :mod:`.elementwise` — math functions (exp, log, trigonometric, hyperbolic, erf family,
  rounding, powers, ``neg``/``abs``/``sign``);
* :mod:`.arithmetic` — ``add``/``sub``/``mul``/``div``/``rem``, ``nextafter``, ``max``/``min``,
  ``clamp``, ``empty``;
* :mod:`.bitwise` — bit and logic operations, shifts, ``population_count``, comparisons,
  ``select_n``;
* :mod:`.conversions` — ``convert_element_type``, ``reduce_precision``, the identities;
* :mod:`.reductions` — reductions, ``argmax``/``argmin``, cumulative scans;
* :mod:`.layout` — broadcasting, reshapes, transposes, slices, concatenation, ``iota``, ``pad``;
* :mod:`.contractions` — ``dot_general`` and ``conv_general_dilated``;
* :mod:`.sorting` — ``sort`` and ``top_k``;
* :mod:`.common` — the helpers they share.

Every family registers into the one rule table, :data:`~fornax.frameworks.jax.lowering.RULES`,
with :func:`~fornax.frameworks.jax.lowering.lowering`; importing this package registers all of
them.  Indexing, PRNG and windowed primitives have their own modules beside this package
(:mod:`..indexing`, :mod:`..rng`, :mod:`..windows`); control flow and calls are not rules
(:mod:`..program`).

Every rule follows XLA's semantics as ``jax.jit`` on CPU computes them (see
:mod:`..lowering` for the rule contract and the device dtypes):

* float16/bfloat16 elementwise math is done in float32 and rounded once per
  primitive (a rule of several graph ops, such as ``asinh``, rounds only its
  result); sums, products, dot products and convolutions of them accumulate in
  float32.  Where jax itself lowers a primitive to several operations in the
  narrow type (``integer_pow``'s multiplies, ``exp2`` as exp(x · ln 2)), XLA
  rounds after each and so does the rule.  Results agree with jax's to one ulp.
* Integer arithmetic wraps in two's complement at the jax type's width, carried
  integers included (``uint32`` add/sub/mul in int64, then ``ctx.wrap``; int64
  products wrap mod 2**64, so their low bits are right).  Integer ``div``
  truncates toward zero, ``rem`` has the dividend's sign; x/0 is -1 (all ones
  unsigned), x%0 is x, INT_MIN/-1 is INT_MIN.  Shifts by at least the bit width
  (or by a negative amount) give 0, or the sign fill for ``shift_right_arithmetic``,
  which shifts the bit pattern of unsigned types as signed.
* float → integer conversion truncates toward zero and saturates at the target's
  range; NaN becomes 0 (XLA CPU).  integer → integer wraps; x → bool is x != 0.
* ``max``/``min`` (and the reductions, scans and ``clamp`` over them) propagate NaN;
  where both operands are zeros of different signs, the sign of the result may
  differ from XLA's (which orders -0.0 below 0.0);
  ``argmax``/``argmin`` take the first NaN as the extreme and the lowest index
  among ties; ``sort`` puts NaN last and treats -0.0 and 0.0 as equal (jax's sort
  comparator), and is always stable; ``top_k`` follows XLA's total order (NaN
  largest, 0.0 above -0.0) and takes equal values lower index first.  A NaN's sign
  is not observable in the graph IR: every NaN counts as positive.
* ``reduce_precision`` to bfloat16's or float16's format rounds through a cast;
  narrowing the exponent flushes results below the smallest normal to (signed)
  zero, as XLA does.
* ``erf_inv`` is Giles' single-precision approximation (XLA's, evaluated in
  float32); ``erfc`` is 1 - erf below 2 and Laplace's continued fraction above,
  in float64, so its small values keep full float32 precision.
* XLA CPU flushes subnormal float operands and results of arithmetic to zero;
  fornax's device keeps them (as IEEE arithmetic does), so the two differ there.

Refused (``NotLowerable``, so the equation runs on the host, or no rule):
``erfc``/``erf_inv`` of float64 (full float64 precision needs rational
approximations beyond this table), integer convolutions, integer dot products
whose broadcast product exceeds :data:`~.contractions.MAX_INT_DOT` elements,
``reduce_precision`` to formats other than bfloat16/float16/float32 and ``sort`` along
axes longer than :data:`~fornax.frameworks.builders.MAX_SORT`; ``lgamma``, ``digamma``
(no approximation accurate to float32 across their poles here) and ``clz`` have no rule.
"""

from __future__ import annotations

# imported in this order, the families register their rules in the order the table has always had
from . import elementwise, arithmetic, bitwise, conversions, reductions, layout, contractions, sorting
from .contractions import MAX_INT_DOT
from .layout import pad

__all__ = ["MAX_INT_DOT", "arithmetic", "bitwise", "contractions", "conversions", "elementwise", "layout",
           "pad", "reductions", "sorting"]
