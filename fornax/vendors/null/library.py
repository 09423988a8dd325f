"""null library: the Library protocol with nothing implemented."""

from __future__ import annotations

from .driver import not_implemented
from .facts import FACTS


class NullLibrary:
    """Named routines (GEMM, ...) on top of a runtime — to be written."""

    vendor = FACTS["name"]
    name = "null-library"

    def __init__(self, runtime):
        self.runtime = runtime
        #: one CallRecord per routine call, for the report (append as the routines run)
        self.calls: list = []

    def formats(self):
        raise not_implemented("library.formats")

    def ops(self):
        raise not_implemented("library.ops")

    def gemm(self, a, b, c, params, stream=None):
        raise not_implemented("library.gemm")

    def report(self):
        raise not_implemented("library.report")

    def sparse_info(self):
        raise not_implemented("library.sparse_info")

    def sparse_prune(self, a, out, params, stream=None):
        raise not_implemented("library.sparse_prune")

    def sparse_prune_check(self, a, params, stream=None):
        raise not_implemented("library.sparse_prune_check")

    def sparse_compressed_size(self, params):
        raise not_implemented("library.sparse_compressed_size")

    def sparse_compress(self, a, out, params, stream=None):
        raise not_implemented("library.sparse_compress")

    def sparse_matmul(self, a, b, c, params, stream=None):
        raise not_implemented("library.sparse_matmul")

    def sparse_predict(self, params):
        raise not_implemented("library.sparse_predict")

    def custom_kernel(self, program, grid, args, stream=None):
        raise not_implemented("library.custom_kernel")

    def attention_bwd(self, q, k, v, o, do, lse, dq, dk, dv, params, stream=None):
        raise not_implemented("library.attention_bwd")

    def attention_fwd(self, q, k, v, o, lse, params, stream=None):
        raise not_implemented("library.attention_fwd")

    def communicator(self, devices=None, timeout_s=None):
        raise not_implemented("library.communicator")

    def conv2d_bwd_data(self, dy, w, dx, params, stream=None):
        raise not_implemented("library.conv2d_bwd_data")

    def conv2d_bwd_weights(self, x, dy, dw, params, stream=None):
        raise not_implemented("library.conv2d_bwd_weights")

    def conv2d_fwd(self, x, w, y, params, stream=None):
        raise not_implemented("library.conv2d_fwd")

    def layer_norm_bwd(self, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, params, stream=None):
        raise not_implemented("library.layer_norm_bwd")

    def layer_norm_fwd(self, x, gamma, beta, y, mean, rstd, params, stream=None):
        raise not_implemented("library.layer_norm_fwd")

    def paged_attention(self, q, key_cache, value_cache, block_tables, seq_lens, query_start, o, params,
                        stream=None):
        raise not_implemented("library.paged_attention")

    def paged_cache_write(self, k, v, key_cache, value_cache, slots, params, stream=None):
        raise not_implemented("library.paged_cache_write")

    def pool2d_bwd(self, dy, dx, params, indices=None, stream=None):
        raise not_implemented("library.pool2d_bwd")

    def pool2d_fwd(self, x, y, params, indices=None, stream=None):
        raise not_implemented("library.pool2d_fwd")

    def rms_norm_bwd(self, dy, x, gamma, rstd, dx, dgamma, params, stream=None):
        raise not_implemented("library.rms_norm_bwd")

    def rms_norm_fwd(self, x, gamma, y, rstd, params, stream=None):
        raise not_implemented("library.rms_norm_fwd")

    def softmax_bwd(self, y, dy, dx, params, stream=None):
        raise not_implemented("library.softmax_bwd")

    def softmax_fwd(self, x, y, params, stream=None):
        raise not_implemented("library.softmax_fwd")
