"""Lab 5, exercise 5.5 (reference): a tiled GEMM kernel in the tile ISA.

Each program instance computes one T x T tile of C: a loop over K in steps of BK loads a
T x BK tile of A and a BK x T tile of B (masked at the ragged edges) and accumulates their
product with one Dot, so every element of A is read ceil(N/T) times and every element of B
ceil(M/T) times -- not N and M times, as a one-output-per-lane kernel reads them.
"""

from fornax.layers.kernel_builder import KernelBuilder
from fornax.sim import isa

T = 32      # output tile (rows and columns)
BK = 32     # K depth of one step


def build(M, N, K):
    kb = KernelBuilder(f"tiled_gemm_{M}x{N}x{K}")
    a, b, c = (kb.param(p, "ptr", "float32") for p in ("a", "b", "c"))
    m, n, k = kb.const(M, "int64"), kb.const(N, "int64"), kb.const(K, "int64")
    rows = kb.emit(isa.Reshape(kb.reg(), kb.iadd(kb.imul(kb.pid(1), T), kb.arange(T)), (T, 1)))
    cols = kb.emit(isa.Reshape(kb.reg(), kb.iadd(kb.imul(kb.pid(0), T), kb.arange(T)), (1, T)))
    row_ok, col_ok = kb.binary("lt", rows, m), kb.binary("lt", cols, n)
    k_row = kb.emit(isa.Reshape(kb.reg(), kb.arange(BK), (1, BK)))     # K index along A's row
    k_col = kb.emit(isa.Reshape(kb.reg(), kb.arange(BK), (BK, 1)))     # K index down B's column
    acc = kb.emit(isa.Broadcast(kb.reg(), kb.const(0.0, "float32"), (T, T)))
    start = len(kb.body)                       # the loop body: emitted, then moved into the Loop
    ka, kr = kb.binary("add", k_row, "%k"), kb.binary("add", k_col, "%k")
    tile_a = kb.emit(isa.Load(kb.reg(), a, kb.binary("add", kb.binary("mul", rows, k), ka),
                              kb.binary("and", row_ok, kb.binary("lt", ka, k))))
    tile_b = kb.emit(isa.Load(kb.reg(), b, kb.binary("add", kb.binary("mul", kr, n), cols),
                              kb.binary("and", kb.binary("lt", kr, k), col_ok)))
    kb.emit(isa.Dot(acc, tile_a, tile_b, acc, "float32"))
    body = tuple(kb.body[start:])
    del kb.body[start:]
    kb.emit(isa.Loop("%k", 0, K, BK, body))
    kb.emit(isa.Store(c, kb.binary("add", kb.binary("mul", rows, n), cols), acc,
                      kb.binary("and", row_ok, col_ok)))
    return kb.program(group_size=128), (-(-N // T), -(-M // T), 1)
