"""The ATen → fornax graph IR lowering table, shared by both PyTorch paths.

The eager device lowers each ATen op that reaches the ``fornax`` key into a
one-op graph; the graph path (``torch.compile`` / ``torch.export``) lowers an
FX graph of core ATen ops node by node.  Both call :func:`lower` with a
:class:`LowerCtx` (the graph being built and what torch says every tensor
output is) and the op's arguments, Tensors already replaced by graph
:class:`~fornax.layers.graph.Value` s.

Keys are overload names: ``str(op._schema.name) + "." + op._overloadname``,
so the default overload is ``"aten::relu.default"`` and others read
``"aten::add.Tensor"``, ``"aten::sum.dim_IntList"``.  A lowering is one
decorated function whose parameters are the schema's argument names::

    @lowering("aten::add.Tensor", "aten::add.Scalar")
    def add(ctx, self, other, alpha=1): ...

Semantics are PyTorch's, not the graph IR's: result dtypes come from
``ctx.outs`` (torch's own answer, so type promotion with Python scalars and
0-d tensors is exactly torch's), arithmetic on float16/bfloat16 is done in
float32 and rounded once (as torch's CPU kernels do), integer sums widen to
int64, ``div`` rounding modes, ``remainder``/``fmod`` signs, ``argmax`` ties,
``pow`` special exponents, ``clamp`` with absent bounds, ``var`` corrections
and both ``gelu`` approximations follow torch.

Honest limits (a refusal raises :class:`NotLowerable` with its reason):

* dtypes outside float64/32/16, bfloat16, int64/32 and bool (complex, uint8,
  int8, int16, float8) have no graph dtype;
* the graph IR has no zero-element tensors: an output torch makes empty is
  returned as ``None`` (the caller makes the empty tensor), and any op whose
  outputs are all empty (lowered or not) is answered with ``None`` s;
* ops whose result shape depends on data (``nonzero``, boolean-mask
  indexing, ``unique``) and random ops (dropout with ``0 < p < 1`` in
  training: RNG belongs to the framework's generator) are not lowered;
* ops that mutate an input (``native_batch_norm`` in training with running
  statistics) are not lowered: use the functional form
  (``_native_batch_norm_legit_functional``), which returns the new stats;
* ``as_strided`` indexes the input's own contiguous row-major elements (the
  caller passes the base it strides into);
* 3-d pooling, ``embedding_bag``, ``grid_sampler``, ``cdist``/``pdist``, FFTs,
  ``erfc`` (1 - erf loses its small values) and the allocation ops (``empty``,
  ``empty_strided``, ``resize_``: the eager path allocates) have no lowering;
* integer matrix products, ``pow`` of integers to negative integer powers,
  ``max_pool2d`` of integers, the ``mean`` of integers in ``scatter_reduce``,
  ``sort`` (and ``topk`` of more than 64 elements, which sorts) along an axis
  longer than 2**16 (a bitonic network of log2(n)**2 / 2 stages) and
  ``prod``/``amax``/``amin`` scatters (and ``scatter`` with
  ``reduce="multiply"``) of more than 2**22 update-position pairs (they compare
  every update with every position) are refused;
* ``index_put`` with a boolean mask is lowered when the value is the same for
  every selected element (``x[mask] = v``); per-element values need the count
  of selected elements (a data-dependent shape);
* ``topk`` puts equal values lower index first (torch's order among ties is
  unspecified); ``_adaptive_avg_pool2d`` with uneven windows and
  ``upsample_bilinear2d`` use averaging matrices, so an inf/NaN input also
  reaches the other outputs of its row (0 * inf).

In-place overloads (``aten::add_.Tensor``, ``aten::_foreach_mul_.Scalar``...) share
their functional op's lowering: ``ctx.outs`` then describes the new value of each
mutated argument (``self``, or each element of a ``_foreach`` list), the lowering
returns those values, and the caller writes them back.

A wrapped number (the 0-d CPU tensor ATen makes from a Python scalar in
``x + 2.5``) should be passed as the Python scalar: as a 0-d tensor it would
take part in type promotion as a tensor, which changes what comparisons and
``where`` compute in.

The package: one registration table (:mod:`.table`), into which each family module
registers its lowerings with the :func:`lowering` decorator; this ``__init__`` imports every
family, so the table is complete once the package is imported, and then gives each in-place
overload its functional op's lowering (:func:`~.table.register_inplace`).

* the machinery: :mod:`.table` (the table, :func:`lowering`, :func:`lookup`),
  :mod:`.dispatch` (:func:`lower`), :mod:`.single_op` (:func:`single_op_graph`),
  :mod:`.context` (:class:`LowerCtx`, :class:`OutMeta`), :mod:`.dtypes`, :mod:`.errors`
  (:class:`NotLowerable`);
* helpers the families share: :mod:`.promotion` (torch's type promotion, compute dtypes),
  :mod:`.operands` (scalars and Values in a dtype), :mod:`.axes` (dims and per-axis
  reductions);
* the families: :mod:`.arithmetic`, :mod:`.comparison`, :mod:`.unary`, :mod:`.activations`,
  :mod:`.softmax`, :mod:`.reductions`, :mod:`.factories`, :mod:`.shape`, :mod:`.indexing`,
  :mod:`.linalg`, :mod:`.convolution`, :mod:`.pooling`, :mod:`.normalization`,
  :mod:`.attention`, :mod:`.losses`, :mod:`.dropout`, :mod:`.selection`, :mod:`.foreach`,
  :mod:`.histc`.
"""

from __future__ import annotations

from . import (activations, arithmetic, attention, comparison, convolution, dropout, factories,  # noqa: F401
               foreach, histc, indexing, linalg, losses, normalization, pooling, reductions, selection, shape,
               softmax, unary)
from .context import LowerCtx, OutMeta
from .dispatch import IGNORED_KWARGS, lower, resolve
from .dtypes import DTYPE_TO_TORCH, TORCH_TO_DTYPE, graph_dtype
from .errors import NotLowerable
from .single_op import output_metas, single_op_graph
from .table import TABLE, lookup, lowering, op_key, register_inplace

register_inplace()

#: the overload names of every lowered op
LOWERED_OPS: frozenset[str] = frozenset(TABLE)

# the spellings of the single-module days, which tests reach into
_TABLE = TABLE
_resolve = resolve
_IGNORED_KWARGS = IGNORED_KWARGS

__all__ = ["DTYPE_TO_TORCH", "IGNORED_KWARGS", "LOWERED_OPS", "TABLE", "TORCH_TO_DTYPE", "LowerCtx", "NotLowerable",
           "OutMeta", "graph_dtype", "lookup", "lower", "lowering", "op_key", "output_metas", "resolve",
           "single_op_graph"]
