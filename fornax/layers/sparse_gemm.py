"""2:4 structured-sparse GEMM on a library (cuSPARSELt / hipSPARSELt-shaped).

:class:`SparseGemmRoutines` is mixed into :class:`~fornax.layers.library.LibraryBase`.
Its five calls follow the real libraries' workflow, and each family names them
in ``vendor.toml`` ``[library.sparse.calls]``:

=====================  ====================================================================
``sparse_prune``       keep the two largest magnitudes of every four along K (``...SpMMAPrune``)
``sparse_prune_check`` is a matrix 2:4? (``...SpMMAPruneCheck``: ``d_valid`` 0 or 1)
``sparse_compressed_size``  bytes the compressed matrix needs (``...SpMMACompressedSize``)
``sparse_compress``    write the compressed values and metadata (``...SpMMACompress``)
``sparse_matmul``      ``C = alpha * A @ op(B) + bias`` from the compressed A (``...Matmul``)
=====================  ====================================================================

The sparse operand A is ``m x k``, row-major, 2:4-sparse along K (the weight of a linear
layer: ``m`` output features, ``k`` input features).  The compressed buffer holds the kept
values ``[m, k/2]`` from its start and the int32 metadata ``[m, ceil(k/32)]`` from the next
256-byte boundary (:mod:`fornax.sim.sparsity` has the format).  ``params``:

=====================  ====================================================================
``m n k``              sizes (``n`` for the matmul only); each a multiple of ``alignment``
``dtype``              A and B: one of ``[library.sparse] dtypes``
``out_dtype``          C: the input dtype (default) or float32
``trans_b``            B is stored ``n x k`` (an activation matrix, row-major) instead of ``k x n``
``c_col``              C is stored column-major (``n x m`` row-major: ``F.linear``'s output)
``alpha``              scale of the product (default 1)
``bias``               device address of ``m`` elements of the output dtype, one per row of A
``workspace_limit``    most bytes of float32 split-K partials (default: the library's)
=====================  ====================================================================

Every call but the size query is a device kernel, ordered on ``stream``: prune and compress
(:mod:`fornax.layers.sparse_compress`) and the matmul (:mod:`fornax.layers.sparse_kernel`),
which executes the compressed operand.  The prune check reads its count back (it answers
on the host), and compress runs the check first and refuses a matrix that is not 2:4.  A family
whose library has no 2:4 GEMM (``supported = false``) refuses every call with its own
code, the reason and what to do instead.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..sim import isa, sparsity
from ..sim.cost import kernel_cost
from ..sim.device import estimate_counters
from . import sparse_compress, sparse_kernel
from .binary import KernelBinary, ShippedImage
from .call_record import CallRecord
from .driver import Module
from .errors import ErrorTable, FornaxError
from .gemm import Algorithm, GemmRoutines
from .runtime import Runtime, Stream

#: the metadata starts at this alignment inside the compressed buffer
METADATA_ALIGN = 256
#: matrix rows one program instance of the prune, check and compress kernels covers
PREP_ROWS = 32


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class SparseGemmRoutines(GemmRoutines):
    """2:4 sparse GEMM (mixin for LibraryBase): prune, check, compress, matmul."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        facts: dict[str, Any] = self.facts["library"].get("sparse") or {}
        self.sparse_facts = facts
        e = facts.get("errors")
        self._sparse_errors = None if e is None else ErrorTable(
            e["api"], e["codes"], e["conditions"], seam="library", vendor=self.vendor)
        self._sparse_programs: dict[sparse_kernel.SparseVariant, tuple[isa.Program, isa.Program | None]] = {}
        self._sparse_images: dict[tuple[sparse_kernel.SparseVariant, str, str], KernelBinary] = {}
        self._prep_programs: dict[tuple[str, str], isa.Program] = {}
        self._prep_images: dict[tuple[tuple[str, str], str, str], KernelBinary] = {}

    # -- facts and errors ------------------------------------------------------------------
    def sparse_info(self) -> dict[str, Any]:
        """The family's ``[library.sparse]`` facts, less its error table (see :class:`Library`)."""
        f = self.sparse_facts
        if not f:
            return {"name": self.name, "supported": False}
        return {key: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                for key, v in f.items() if key != "errors"}

    def _call(self, call: str) -> str:
        calls: dict[str, str] = self.sparse_facts.get("calls", {})
        return calls.get(call) or calls.get("matmul") or call

    def _sparse_error(self, condition: str, call: str, message: str,
                      hint: str | None = None) -> FornaxError:
        table = self._sparse_errors
        api = self._call(call)
        if table is None:
            return self._error(f"{api}: {message}", hint=hint)
        name = table.faults.get(condition) or table.faults["unknown"]
        return table.error(name, f"{api}: {message}", op=self.sparse_facts.get("name", self.name),
                           hint=hint)

    def _supported(self, call: str) -> None:
        f = self.sparse_facts
        if not f:
            raise self._error(f"{self.name} has no 2:4 structured-sparse GEMM ([library.sparse] "
                              "is absent)", hint="run the dense GEMM on the pruned matrix")
        if not f["supported"]:
            raise self._sparse_error("unsupported", call,
                                     f"{self.vendor} ({f['name']}) has no 2:4 structured-sparse "
                                     f"GEMM: {f['reason']}", hint=f["hint"])

    def _sizes(self, call: str, params: dict[str, Any], keys: tuple[str, ...]) -> dict[str, int]:
        if not isinstance(params, dict):
            raise self._sparse_error("invalid_argument", call,
                                     f"params must be a dict, got {type(params).__name__}")
        missing = [key for key in keys + ("dtype",) if key not in params]
        if missing:
            raise self._sparse_error("invalid_argument", call, f"params lack {', '.join(missing)}",
                                     hint=f"pass {', '.join(keys)} and dtype")
        sizes = {key: params[key] for key in keys}
        bad = {key: v for key, v in sizes.items() if not _is_int(v) or v <= 0}
        if bad:
            raise self._sparse_error("invalid_argument", call, "sizes must be positive integers, got "
                                     + " ".join(f"{key}={v!r}" for key, v in bad.items()))
        align = int(self.sparse_facts["alignment"])
        off = {key: int(v) for key, v in sizes.items() if int(v) % align}
        if off:
            raise self._sparse_error(
                "alignment", call, " ".join(f"{key}={v}" for key, v in off.items())
                + f" is not a multiple of {align}, which {self.sparse_facts['name']} requires of "
                  f"every size of a 2:4 GEMM in {params['dtype']}",
                hint=f"pad the matrices to multiples of {align} (zeros keep the product)")
        return {key: int(v) for key, v in sizes.items()}

    def _dtype(self, call: str, params: dict[str, Any]) -> str:
        dtype = params["dtype"]
        dtype = getattr(dtype, "value", dtype)
        allowed = list(self.sparse_facts["dtypes"])
        if dtype not in allowed:
            raise self._sparse_error("dtype", call, f"2:4 sparse GEMM does not support {dtype} "
                                     f"(supports {', '.join(allowed)})",
                                     hint="cast the matrices to one of those, or use the dense GEMM")
        spec = self._spec()
        if spec.sparse_peak(dtype) is None:
            raise self._sparse_error("no_instruction", call,
                                     f"the device ({spec.name}) has no 2:4 sparse matrix "
                                     f"instruction for {dtype}",
                                     hint="use a device whose chip spec lists sparse_matrix_peak, or "
                                          "the dense GEMM")
        return str(dtype)

    def _matrix(self, call: str, params: dict[str, Any]) -> tuple[int, int, str]:
        self._supported(call)
        sizes = self._sizes(call, params, ("m", "k"))
        return sizes["m"], sizes["k"], self._dtype(call, params)

    # -- prune, check, compress: device kernels over the matrix ----------------------------
    def _prep(self, kind: str, dtype: str) -> tuple[Module, str]:
        """The loaded module and kernel name of the ``kind`` kernel (prune, check, compress)."""
        key = (kind, dtype)
        if key not in self._prep_programs:
            make = {"prune": sparse_compress.prune_program, "check": sparse_compress.check_program,
                    "compress": sparse_compress.compress_program}[kind]
            self._prep_programs[key] = make(f"{self.sparse_facts['name']}_{kind}_{dtype}", dtype,
                                            PREP_ROWS)
        prog = self._prep_programs[key]
        dev = self.runtime.current_device()
        image = self._image_for(self.runtime.driver.properties(dev).target,
                                self.runtime.driver.loadable_formats(dev))
        ikey = (key, image["format"], image["target"])
        if ikey not in self._prep_images:
            self._prep_images[ikey] = self.build([prog], image["format"], image["target"])
        return self.runtime.load_module(self._prep_images[ikey]), prog.name

    def _sparse_record(self, routine: str, call: str, reason: str, shape: tuple[int, ...],
                       image: str, options: dict[str, Any]) -> CallRecord:
        rec = CallRecord(routine, self._call(call), reason, image, shape, options=options)
        self.calls.append(rec)
        return rec

    def _image_name(self) -> str:
        dev = self.runtime.current_device()
        image = self._image_for(self.runtime.driver.properties(dev).target,
                                self.runtime.driver.loadable_formats(dev))
        return f"{image['format']}:{image['target']}"

    def _violations(self, call: str, a: int, m: int, k: int, dtype: str,
                    stream: Stream | None) -> int:
        """Groups of four of the matrix at ``a`` holding more than two nonzeros (the check
        kernel's count, read back: the caller waits for it)."""
        dev = self.runtime.current_device()
        if self.runtime.driver.devices[dev].meta:
            raise self._sparse_error("invalid_argument", call,
                                     f"device {dev} is shape-only (meta): whether a matrix is 2:4 "
                                     "depends on its data", hint="check on a data-mode stack (meta = false)")
        module, name = self._prep("check", dtype)
        rt = self.runtime
        bad = rt.malloc(8, stream)
        try:
            rt.memcpy_h2d(bad, np.zeros(1, np.int64), stream)
            rt.launch(module, name, sparse_compress.grid(m, k, PREP_ROWS), {"a": a, "bad": bad, "m": m, "k": k},
                      stream)
            count = np.zeros(1, np.int64)
            rt.memcpy_d2h(count, bad, stream)
        finally:
            rt.free(bad)
        return int(count[0])

    def sparse_prune(self, a: int, out: int, params: dict[str, Any],
                     stream: Stream | None = None) -> CallRecord:
        """Write to ``out`` (which may be ``a``) the 2:4 prune of the ``m x k`` matrix at ``a``:
        the two largest magnitudes of every four along K kept, the others zeroed."""
        m, k, dtype = self._matrix("prune", params)
        module, name = self._prep("prune", dtype)
        self.runtime.launch(module, name, sparse_compress.grid(m, k, PREP_ROWS),
                            {"a": a, "out": out, "m": m, "k": k}, stream)
        return self._sparse_record("sparse_prune", "prune", "magnitude: the two largest of every "
                                   "four along K", (m, k), self._image_name(), {"dtype": dtype})

    def sparse_prune_check(self, a: int, params: dict[str, Any],
                           stream: Stream | None = None) -> bool:
        """Whether the ``m x k`` matrix at ``a`` is 2:4-sparse along K (the real call's
        ``d_valid`` is 0 then); the record counts the groups that are not.  Synchronous: the
        answer is read back."""
        m, k, dtype = self._matrix("prune_check", params)
        bad = self._violations("prune_check", a, m, k, dtype, stream)
        self._sparse_record("sparse_prune_check", "prune_check",
                            f"{bad} group(s) of four hold more than two nonzeros", (m, k),
                            self._image_name(), {"dtype": dtype, "valid": bad == 0, "violations": bad})
        return bad == 0

    def sparse_compressed_size(self, params: dict[str, Any]) -> tuple[int, int]:
        """(compressed bytes, compress buffer bytes) for an ``m x k`` matrix: the values, the
        metadata from the next 256-byte boundary; compression needs no extra buffer here."""
        m, k, dtype = self._matrix("compressed_size", params)
        values, meta = sparsity.compressed_bytes(m, k, isa.np_dtype(dtype).itemsize)
        return _meta_offset(values) + meta, 0

    def sparse_compress(self, a: int, out: int, params: dict[str, Any],
                        stream: Stream | None = None) -> CallRecord:
        """Compress the 2:4 ``m x k`` matrix at ``a`` into ``out`` (``sparse_compressed_size``
        bytes).  A matrix that is not 2:4 is refused: fornax runs the check kernel first and
        waits for it (the real call compresses such a matrix wrongly without a word)."""
        m, k, dtype = self._matrix("compress", params)
        bad = self._violations("compress", a, m, k, dtype, stream)
        if bad:
            raise self._sparse_error(
                "not_sparse", "compress", f"the {m}x{k} matrix is not 2:4-sparse along K: {bad} "
                f"group(s) of four hold more than two nonzeros ({self._call('prune_check')} "
                "reports it invalid)", hint=f"prune it first ({self._call('prune')})")
        values = sparsity.compressed_bytes(m, k, isa.np_dtype(dtype).itemsize)[0]
        module, name = self._prep("compress", dtype)
        self.runtime.launch(module, name, sparse_compress.grid(m, k, PREP_ROWS),
                            {"a": a, "values": out, "e": out + _meta_offset(values), "m": m, "k": k,
                             "kh": k // 2, "kw": sparsity.metadata_words(k)}, stream)
        return self._sparse_record("sparse_compress", "compress", "kept values and 2-bit positions",
                                   (m, k), self._image_name(),
                                   {"dtype": dtype, "values_bytes": values,
                                    "metadata_bytes": m * sparsity.metadata_words(k) * 4})

    # -- the device kernel -----------------------------------------------------------------
    def _sparse_variant(self, m: int, n: int, k: int, dtype: str, out: str, bias: bool,
                        limit: int) -> tuple[sparse_kernel.SparseVariant, str, str]:
        """The tile (and split-K) of a matmul: the library's GEMM heuristic over its algorithms
        (cuSPARSELt picks split-K the same way, by filling the device), with each K slice a
        whole number of metadata words and its float32 partials within ``limit`` bytes."""
        step = isa.SPARSE_K_PER_WORD

        def workspace(a: Algorithm) -> int:
            return a.split_k * m * n * 4 if a.split_k > 1 else 0
        candidates = [a for a in self._candidates(dtype, workspace, limit)
                      if a.split_k == 1 or (k // a.split_k) % step == 0]
        algo, why = self.choose(m, n, 1, k, dtype, candidates)
        bm, bn, bk = algo.effective(dtype)
        bk = max(step, -(-bk // step) * step)
        v = sparse_kernel.SparseVariant(dtype, out, (bm, bn, bk), bias, algo.split_k)
        return v, algo.name, why

    def _sparse_programs_of(self, v: sparse_kernel.SparseVariant) -> tuple[isa.Program, isa.Program | None]:
        if v not in self._sparse_programs:
            base = f"{self.sparse_facts['name']}_spmma_{v.tag()}"
            self._sparse_programs[v] = (
                sparse_kernel.program(base, v, self.group_size),
                sparse_kernel.reduce_program(f"{base}_reduce", v, self.group_size) if v.split > 1 else None)
        return self._sparse_programs[v]

    def _sparse_module(self, v: sparse_kernel.SparseVariant) -> tuple[Module, ShippedImage]:
        dev = self.runtime.current_device()
        image = self._image_for(self.runtime.driver.properties(dev).target,
                                self.runtime.driver.loadable_formats(dev))
        key = (v, image["format"], image["target"])
        if key not in self._sparse_images:
            self._sparse_images[key] = self.build([p for p in self._sparse_programs_of(v) if p is not None],
                                                  image["format"], image["target"])
        return self.runtime.load_module(self._sparse_images[key]), image

    def _matmul_problem(self, params: dict[str, Any]) -> tuple[dict[str, Any], sparse_kernel.SparseVariant, str, str]:
        call = "matmul"
        self._supported(call)
        sizes = self._sizes(call, params, ("m", "n", "k"))
        dtype = self._dtype(call, params)
        out = params.get("out_dtype") or dtype
        out = getattr(out, "value", out)
        if out not in (dtype, "float32"):
            raise self._sparse_error("dtype", call, f"{dtype} inputs cannot write {out} "
                                     f"(outputs: {dtype}, float32)")
        flags = {}
        for key in ("trans_b", "c_col"):
            val = params.get(key, False)
            if not isinstance(val, (bool, np.bool_)):
                raise self._sparse_error("invalid_argument", call, f"{key} must be true or false, "
                                         f"got {val!r}")
            flags[key] = bool(val)
        alpha = params.get("alpha", 1.0)
        if not isinstance(alpha, (int, float, np.integer, np.floating)) or isinstance(alpha, bool) \
                or not math.isfinite(alpha):
            raise self._sparse_error("invalid_argument", call, f"alpha must be a finite number, "
                                     f"got {alpha!r}")
        bias = params.get("bias")
        if bias is not None and not _is_int(bias):
            raise self._sparse_error("invalid_argument", call, f"bias must be a device address, "
                                     f"got {bias!r}")
        limit = params.get("workspace_limit", self.workspace_limit)
        if not _is_int(limit) or limit < 0:
            raise self._sparse_error("invalid_argument", call, "workspace_limit must be a "
                                     f"non-negative integer, got {limit!r}")
        v, algo, why = self._sparse_variant(sizes["m"], sizes["n"], sizes["k"], dtype, str(out),
                                            bias is not None, int(limit))
        problem = {**sizes, **flags, "alpha": float(alpha), "bias": bias}
        return problem, v, algo, why

    @staticmethod
    def _scalars(p: dict[str, Any], v: sparse_kernel.SparseVariant) -> dict[str, Any]:
        m, n, k = p["m"], p["n"], p["k"]
        b_rs, b_cs = (1, k) if p["trans_b"] else (n, 1)
        c_rs, c_cs = (1, m) if p["c_col"] else (n, 1)
        return {"m": m, "n": n, "k": k, "kh": k // 2, "kw": sparsity.metadata_words(k),
                "b_rs": b_rs, "b_cs": b_cs, "c_rs": c_rs, "c_cs": c_cs, "alpha": p["alpha"],
                "ks": k // v.split}

    def sparse_matmul(self, a: int, b: int, c: int, params: dict[str, Any],
                      stream: Stream | None = None) -> CallRecord:
        """``C = alpha * A @ op(B) + bias`` from the compressed A at ``a`` (see the module
        docstring for ``params``); C is written, never read.  A split-K choice allocates its
        float32 partials on ``stream`` and frees them before returning (the record's
        ``workspace``)."""
        p, v, algo, why = self._matmul_problem(params)
        module, image = self._sparse_module(v)
        main, red = self._sparse_programs_of(v)
        values = sparsity.compressed_bytes(p["m"], p["k"], isa.np_dtype(v.dtype).itemsize)[0]
        args = {"a": a, "e": a + _meta_offset(values), "b": b, "c": c, **self._scalars(p, v)}
        if p["bias"] is not None:
            args["bias"] = int(p["bias"])
        g_main, g_red = sparse_kernel.grids(v, p["m"], p["n"])
        rt, ws_bytes = self.runtime, sparse_kernel.workspace_bytes(v, p["m"], p["n"])
        if red is None or g_red is None:
            rt.launch(module, main.name, g_main, args, stream)
        else:
            ws = rt.malloc(ws_bytes, stream)
            try:
                rt.launch(module, main.name, g_main, {**args, "c": ws}, stream)
                rt.launch(module, red.name, g_red, {**args, "ws": ws}, stream)
            finally:
                rt.free(ws)
        options = {"dtype": v.dtype, "out_dtype": v.out, "trans_b": p["trans_b"],
                   "c_col": p["c_col"], "alpha": p["alpha"], "bias": p["bias"] is not None,
                   "tile": list(v.tile), "split_k": v.split, "algorithm": algo, "sparsity": "2:4"}
        rec = CallRecord("sparse_matmul", f"{self._call('matmul')} {algo}",
                         f"2:4 sparse tile {'x'.join(map(str, v.tile))} from {why}",
                         f"{image['format']}:{image['target']}", (1, p["m"], p["n"], p["k"]),
                         ws_bytes, options=options)
        self.calls.append(rec)
        return rec

    def sparse_predict(self, params: dict[str, Any]) -> float:
        """Simulated seconds of :meth:`sparse_matmul` on ``params`` (its kernels' estimates
        priced by the cost model with the current device's spec), running nothing."""
        p, v, _, _ = self._matmul_problem(params)
        main, red = self._sparse_programs_of(v)
        values = sparsity.compressed_bytes(p["m"], p["k"], isa.np_dtype(v.dtype).itemsize)[0]
        item = isa.np_dtype(v.dtype).itemsize
        b0 = _meta_offset(values) + p["m"] * sparsity.metadata_words(p["k"]) * 4
        c0 = b0 + p["k"] * p["n"] * item
        ws = c0 + p["m"] * p["n"] * 4
        args = {"a": 0, "e": _meta_offset(values), "b": b0, "c": ws if red else c0, "bias": c0,
                "ws": ws, **self._scalars(p, v)}
        g_main, g_red = sparse_kernel.grids(v, p["m"], p["n"])
        spec = self._spec()
        total = kernel_cost(spec, estimate_counters(main, g_main, args), main.meta).duration_s
        if red is not None and g_red is not None:
            total += kernel_cost(spec, estimate_counters(red, g_red, {**args, "c": c0}), red.meta).duration_s
        return total


def _meta_offset(values_bytes: int) -> int:
    return -(-values_bytes // METADATA_ALIGN) * METADATA_ALIGN
