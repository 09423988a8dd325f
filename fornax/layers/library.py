"""The library seam: named library routines (BLAS-like GEMM; DNN and collectives beside it).

A library sits on the runtime seam, like cuBLAS on the CUDA runtime.  It
ships its kernels as binaries in its family's format for a list of targets
(``vendor.toml`` ``[library]``); on a device outside that list it fails the
way real libraries do, unless one of its images is a virtual ISA the driver
can JIT for the device.  Each call picks an algorithm by a heuristic over
shape, dtype and compute units (or, for GEMM, by an autotuner that prices
every candidate with the simulator's cost model), and says why.

:class:`Library` is the seam's contract: everything a front end, the
compiler's plans, the stack, the report, ``compare``, ``qualify`` and the
conformance suites call on a library.  :class:`LibraryBase` is the shared
implementation a family subclasses; it composes

* :mod:`fornax.layers.library_core` -- facts, shipped images, the call log;
* :mod:`fornax.layers.gemm` -- GEMM (cuBLASLt-shaped; kernels in :mod:`fornax.layers.blas`);
* :mod:`fornax.layers.sparse_gemm` -- 2:4 structured-sparse GEMM (cuSPARSELt-shaped);
* :mod:`fornax.layers.dnn` -- convolution, attention, norms, softmax, pooling;
* :mod:`fornax.layers.paged` -- the paged KV-cache write and paged attention (LLM serving);
* :mod:`fornax.layers.collectives` -- communicators (NCCL/RCCL/oneCCL-like).

Every routine takes device addresses (ints, the current device's primary
context) and a ``params`` dict, orders its work on ``stream`` (the default
stream when None), returns a :class:`~fornax.layers.call_record.CallRecord`
and appends it to ``calls``.  Failures the caller can cause are
:class:`~fornax.layers.errors.LibraryError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from .call_record import CallRecord
from .collectives import Communicator
from .paged import PagedRoutines
from .gemm import SPLIT_K_FILL, SPLIT_K_MIN_STEPS, Algorithm, GemmProblem
from .sparse_gemm import SparseGemmRoutines
from .binary import ShippedImage
from .library_core import LibraryCore
from .driver import KernelArgs
from .runtime import Stream
from ..sim.isa import Program

__all__ = ["SPLIT_K_FILL", "SPLIT_K_MIN_STEPS", "Algorithm", "CallRecord", "GemmProblem", "Library",
           "LibraryBase", "LibraryCore", "ShippedImage"]


@runtime_checkable
class Library(Protocol):
    """What the rest of fornax calls on a library.

    Addresses are device virtual addresses (ints) in the current device's primary context,
    owned by the caller (a routine never frees or keeps them); element counts and strides are
    in elements, workspace in bytes, times in simulated seconds.  A routine's launches are
    ordered on ``stream`` (the runtime's default stream when None) after the work already
    queued there, and complete asynchronously: the caller synchronises before reading
    results on the host.  Every routine validates its ``params`` before launching anything
    and raises :class:`~fornax.layers.errors.LibraryError` (what was wrong, and a hint) for a
    bad argument, an unsupported dtype or size, or a device the library ships no image for;
    runtime and driver errors of the launches pass through unchanged.  Each successful call
    returns its :class:`CallRecord` and appends the same record to :attr:`calls`."""

    #: the family's name (``vendor.toml`` ``name``), as every seam of the family reports it
    vendor: str
    #: the library's own name (``[library] name``: "cublas-like", ...), used in kernel names
    name: str

    @property
    def calls(self) -> Sequence[CallRecord]:
        """Every routine call this library has made, oldest first (GEMM and DNN routines;
        collectives are in the communicator's records).  The library owns and appends to it;
        callers read it (the report counts it and lists it as ``algorithms_chosen``)."""

    def formats(self) -> tuple[str, ...]:
        """The binary formats of the images the library ships, each once, in the order
        ``[library] shipped`` lists them; the stack refuses to compose when the driver loads
        none of them."""

    def ops(self) -> frozenset[str]:
        """Names of the graph ops the library computes as one routine (``[library] ops``); the
        compiler routes an op to the library only when its family's policy and this set agree."""

    def gemm(self, a: int, b: int, c: int, params: dict[str, Any],
             stream: Stream | None = None) -> CallRecord:
        """``C[b] = act(alpha * scale * op(A[b]) @ op(B[b]) + beta * C[b] + bias)`` for every
        batch, written over ``c``; ``params`` as :mod:`fornax.layers.gemm` lists them (``m``,
        ``n``, ``k``, ``dtype`` required).  A split-K algorithm allocates its workspace on
        ``stream`` and frees it before returning (the record's ``workspace`` bytes)."""

    # DNN-like routines (shared policy in layers/dnn.py); tensors are contiguous: NCHW for
    # convolution and pooling, [batch, heads, seq, head_dim] for attention, [rows, cols] for
    # norms and softmax; saved statistics (lse, mean, rstd) are float32
    def conv2d_fwd(self, x: int, w: int, y: int, params: dict[str, Any],
                   stream: Stream | None = None) -> CallRecord:
        """``y = conv2d(x, w)``: x [n, c, h, w], w [k, c/groups, r, s], y [n, k, p, q];
        ``params``: n, c, h, w, k, r, s, stride, padding, dilation (ints or pairs), groups, dtype."""

    def conv2d_bwd_data(self, dy: int, w: int, dx: int, params: dict[str, Any],
                        stream: Stream | None = None) -> CallRecord:
        """``dx`` (the input gradient) from dy [n, k, p, q] and w; params as :meth:`conv2d_fwd`."""

    def conv2d_bwd_weights(self, x: int, dy: int, dw: int, params: dict[str, Any],
                           stream: Stream | None = None) -> CallRecord:
        """``dw`` (the filter gradient) from x and dy; params as :meth:`conv2d_fwd`."""

    def attention_fwd(self, q: int, k: int, v: int, o: int, lse: int, params: dict[str, Any],
                      stream: Stream | None = None) -> CallRecord:
        """``o = softmax(scale q k^T [causal]) v`` and the row log-sum-exp ``lse`` [batch, heads,
        seq_q]; ``params``: batch, heads, seq_q, seq_k, head_dim, causal, scale, dtype."""

    def attention_bwd(self, q: int, k: int, v: int, o: int, do: int, lse: int, dq: int, dk: int,
                      dv: int, params: dict[str, Any], stream: Stream | None = None) -> CallRecord:
        """dq, dk and dv (overwritten) from q, k, v, the forward's o and lse, and do; params as
        :meth:`attention_fwd`."""

    def layer_norm_fwd(self, x: int, gamma: int, beta: int, y: int, mean: int, rstd: int,
                       params: dict[str, Any], stream: Stream | None = None) -> CallRecord:
        """``y = (x - mean) * rstd * gamma + beta`` over the last axis, saving mean and rstd (one
        per row); ``params``: rows, cols, eps (default 1e-5), dtype."""

    def layer_norm_bwd(self, dy: int, x: int, gamma: int, mean: int, rstd: int, dx: int,
                       dgamma: int, dbeta: int, params: dict[str, Any],
                       stream: Stream | None = None) -> CallRecord:
        """dx, dgamma and dbeta (overwritten) of :meth:`layer_norm_fwd` from the saved mean and
        rstd; params as there."""

    def rms_norm_fwd(self, x: int, gamma: int, y: int, rstd: int, params: dict[str, Any],
                     stream: Stream | None = None) -> CallRecord:
        """``y = x * rsqrt(mean(x^2) + eps) * gamma`` over the last axis, saving rstd; params as
        :meth:`layer_norm_fwd`."""

    def rms_norm_bwd(self, dy: int, x: int, gamma: int, rstd: int, dx: int, dgamma: int,
                     params: dict[str, Any], stream: Stream | None = None) -> CallRecord:
        """dx and dgamma (overwritten) of :meth:`rms_norm_fwd` from the saved rstd."""

    def softmax_fwd(self, x: int, y: int, params: dict[str, Any],
                    stream: Stream | None = None) -> CallRecord:
        """Softmax over the last axis (log-softmax when ``params["log"]``); rows, cols, dtype."""

    def softmax_bwd(self, y: int, dy: int, dx: int, params: dict[str, Any],
                    stream: Stream | None = None) -> CallRecord:
        """dx of :meth:`softmax_fwd` from its output y and dy; params as there."""

    def pool2d_fwd(self, x: int, y: int, params: dict[str, Any], indices: int | None = None,
                   stream: Stream | None = None) -> CallRecord:
        """2-D max or average pooling over NCHW (``params``: n, c, h, w, kernel, stride, padding,
        mode, dtype); max pooling writes the argmax (int64, one per output) to ``indices``,
        which it requires."""

    def pool2d_bwd(self, dy: int, dx: int, params: dict[str, Any], indices: int | None = None,
                   stream: Stream | None = None) -> CallRecord:
        """dx of :meth:`pool2d_fwd` (max pooling through the forward's ``indices``)."""

    # paged KV-cache routines for LLM serving (shared policy in layers/paged.py): the cache is
    # [num_blocks, block_size, kv_heads, head_dim] per K and V, contiguous, of the routine's dtype
    def paged_cache_write(self, k: int, v: int, key_cache: int, value_cache: int, slots: int,
                          params: dict[str, Any], stream: Stream | None = None) -> CallRecord:
        """vLLM's ``reshape_and_cache``: for every token ``t < num_tokens`` with
        ``slots[t] >= 0``, ``key_cache[slots[t] // block_size, slots[t] % block_size] = k[t]``
        (all kv heads), and the same for ``v`` into ``value_cache``.

        k, v: ``[num_tokens, kv_heads, head_dim]`` contiguous, of ``dtype``; slots: int64
        ``[num_tokens]``; key_cache, value_cache: ``[num_blocks, block_size, kv_heads,
        head_dim]`` contiguous, of ``dtype``, owned by the caller and written in place: rows
        no token's slot names keep their contents.  A negative slot is padding and skips its
        token, and so does a slot at or past ``num_blocks * block_size`` (nothing is written
        outside the cache).  Two tokens naming one slot leave one of them there (which is
        unspecified).  ``params``: num_tokens, num_blocks, block_size, kv_heads, head_dim
        (positive ints), dtype (``[library.dnn] dtypes``).  The write is ordered on ``stream``
        like every launch: an attention call later on the same stream sees it.  Raises
        :class:`~fornax.layers.errors.LibraryError` for a missing or non-positive size, a
        dtype, head dim or block size the family does not support (the message lists
        ``[library.dnn.paged_attention]``'s), and on a shape-only (meta) device, which
        cannot price a kernel whose addresses are data."""

    def paged_attention(self, q: int, key_cache: int, value_cache: int, block_tables: int,
                        seq_lens: int, query_start: int, o: int, params: dict[str, Any],
                        stream: Stream | None = None) -> CallRecord:
        """Causal attention of packed queries over a paged K/V cache (decode steps and
        prefill chunks in one call), written over ``o``.

        q, o: ``[num_tokens, heads, head_dim]`` contiguous, of ``dtype``; sequence ``s`` owns
        query rows ``query_start[s] .. query_start[s+1] - 1`` (``query_start``: int32
        ``[num_seqs + 1]``, non-decreasing, at most ``max_query_len`` rows each); ``seq_lens``:
        int32 ``[num_seqs]``, each sequence's context length *including* its queries, whose
        K/V the caller has already written (:meth:`paged_cache_write`, earlier on the same
        stream or ordered before it).  Query row ``i`` of sequence ``s`` (counted from
        ``query_start[s]``) sits at position ``seq_lens[s] - q_len_s + i`` and attends to
        the keys at positions ``0 ..`` that position.  ``block_tables``: int32 ``[num_seqs,
        max_blocks]``; position ``p`` of sequence ``s`` lives in block
        ``block_tables[s, p // block_size]``, row ``p % block_size``, and entries past a
        sequence's length are never read.  Grouped-query attention: query head ``h`` reads
        kv head ``h // (heads // kv_heads)``.  ``o = softmax(scale q k^T) v`` over the visible
        keys, softmax and accumulation in float32, the probabilities rounded to ``dtype``
        before the second product (as flash kernels do); rows outside every sequence's
        range are left untouched.  ``params``: num_seqs, num_tokens, max_query_len,
        max_blocks, heads, kv_heads, head_dim, block_size (positive ints), scale (default
        ``1/sqrt(head_dim)``), dtype.  The contents of the index buffers are the caller's
        contract (the library cannot read device data before launching): a sequence longer
        than ``max_blocks * block_size`` attends only to that many keys.  Raises
        :class:`~fornax.layers.errors.LibraryError` for a missing or non-positive size,
        ``heads`` not a multiple of ``kv_heads``, ``max_query_len > num_tokens``, a scale that
        is not a finite number, a dtype, head dim or block size the family does not support
        (the message lists ``[library.dnn.paged_attention]``'s), no query tile fitting shared
        memory, and on a shape-only (meta) device."""

    # 2:4 structured-sparse GEMM (cuSPARSELt / hipSPARSELt-like; shared policy in
    # layers/sparse_gemm.py, which lists ``params``); A is m x k row-major, sparse along K.  A
    # family without it (``[library.sparse] supported = false``) raises its own "unsupported"
    # code with the reason and a hint from every call; bad sizes, alignment, dtypes and a
    # device without the sparse matrix instruction raise the family's codes too
    def sparse_info(self) -> dict[str, Any]:
        """The family's 2:4 facts: ``name``, ``supported``, and where supported ``dtypes``,
        ``alignment`` (every size a multiple of it) and ``calls`` (routine -> API name)."""

    def sparse_prune(self, a: int, out: int, params: dict[str, Any],
                     stream: Stream | None = None) -> CallRecord:
        """Write to ``out`` (may be ``a``) the 2:4 magnitude prune of the matrix at ``a``."""

    def sparse_prune_check(self, a: int, params: dict[str, Any],
                           stream: Stream | None = None) -> bool:
        """Whether the matrix at ``a`` is 2:4-sparse along K (synchronous: reads it back)."""

    def sparse_compressed_size(self, params: dict[str, Any]) -> tuple[int, int]:
        """(compressed bytes, compress buffer bytes) of an ``m x k`` matrix."""

    def sparse_compress(self, a: int, out: int, params: dict[str, Any],
                        stream: Stream | None = None) -> CallRecord:
        """Compress the 2:4 matrix at ``a`` into ``out``; a matrix that is not 2:4 is refused."""

    def sparse_matmul(self, a: int, b: int, c: int, params: dict[str, Any],
                      stream: Stream | None = None) -> CallRecord:
        """``C = alpha * A @ op(B) + bias`` from the compressed A at ``a`` (m x n output)."""

    def sparse_predict(self, params: dict[str, Any]) -> float:
        """Simulated seconds :meth:`sparse_matmul` would take on ``params`` (runs nothing)."""

    def custom_kernel(self, program: Program, grid: Sequence[int], args: KernelArgs,
                      stream: Stream | None = None) -> CallRecord:
        """Launch a kernel the caller wrote (a tile-ISA ``program``, e.g. a graph front end's
        custom op) on ``grid`` with ``args`` (parameter name -> device address or scalar): the
        library packs it into its family's image format for the current device (once per
        program), loads it and launches it on ``stream``.  The record names the program as its
        algorithm.  A device the library ships no image format for raises LibraryError."""

    # collectives (NCCL/RCCL/oneCCL-like; shared policy in layers/collectives.py)
    def communicator(self, devices: Sequence[int] | None = None,
                     timeout_s: float | None = None) -> Communicator:
        """A communicator with one rank per device of ``devices`` (distinct device indices;
        default: every device of the runtime's driver), joined by the stack's fabric;
        ``timeout_s``: the watchdog's simulated timeout (default: the family's).  The caller
        owns it; its collectives are listed in :meth:`report`.  A family without collectives
        raises :class:`~fornax.layers.errors.FornaxError`."""

    def report(self) -> dict[str, Any]:
        """The library's part of the run report: at least ``vendor`` and ``name``; the shared
        implementation adds formats, shipped images, algorithms, call and workspace counts,
        every call's choice and reason, and every collective."""


class LibraryBase(SparseGemmRoutines, PagedRoutines):
    """Shared library policy; a vendor subclass sets ``vendor``, ``facts`` and ``encoders``.

    GEMM (:mod:`fornax.layers.gemm`), 2:4 sparse GEMM (:mod:`fornax.layers.sparse_gemm`) and
    the DNN routines (:mod:`fornax.layers.dnn`, with the
    paged KV-cache routines of :mod:`fornax.layers.paged` built on them) are mixed in over
    :class:`~fornax.layers.library_core.LibraryCore`."""

    def custom_kernel(self, program: Program, grid: Sequence[int], args: KernelArgs,
                      stream: Stream | None = None) -> CallRecord:
        """Pack, load (once per program) and launch a caller's kernel (see :class:`Library`)."""
        key = ("custom", program.name, str(id(program)))
        # the program is kept while its image is cached, so its id names it alone
        self.__dict__.setdefault("_custom_programs", {})[key[2]] = program
        module, image = self._dnn_module(key, lambda: [program])
        grid3 = tuple(int(g) for g in grid)
        self.runtime.launch(module, program.name, grid3, args, stream)
        api = self.facts["library"].get("dnn", {}).get("routines", {}).get("custom_kernel", "custom kernel")
        rec = CallRecord("custom_kernel", program.name,
                         f"{api}: the caller's kernel {program.name}, packed as {image}", image, grid3)
        self.calls.append(rec)
        return rec

    def communicator(self, devices: Sequence[int] | None = None,
                     timeout_s: float | None = None) -> Communicator:
        """A communicator with one rank per device of ``devices`` (default: every device);
        ``timeout_s``: the watchdog's simulated timeout (default: the family's)."""
        return Communicator(self, devices, timeout_s)

    def report(self) -> dict[str, Any]:
        return {"vendor": self.vendor, "name": self.name, "formats": list(self.formats()),
                "shipped": [f"{s['format']}:{s['target']}" for s in self.shipped],
                "algorithms": [{"name": a.name, "tile": list(a.tile), "split_k": a.split_k}
                               for a in self.algorithms],
                "calls": len(self.calls),
                "collectives": [r.to_dict() for r in self.collective_records],
                "workspace_bytes": sum(r.workspace for r in self.calls),
                "algorithms_chosen": [{"routine": r.routine, "shape": list(r.shape),
                                       "algorithm": r.algorithm, "image": r.image, "reason": r.reason,
                                       **({"workspace": r.workspace} if r.workspace else {}),
                                       **({"predictions": r.predictions} if r.predictions else {}),
                                       **({"options": r.options} if r.options else {})}
                                      for r in self.calls]}
