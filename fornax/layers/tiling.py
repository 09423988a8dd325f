"""GEMM tile selection, shared by compilers (tiling per target) and libraries (algorithm choice).

The rule is the one BLAS heuristics follow: the largest tile that still gives
every compute unit at least one tile, without wasting much of it on padding —
large tiles re-read A and B fewer times — and, for a problem too small for
that, the tile that leaves the fewest tile-slots idle across its waves.
"""

from __future__ import annotations

import math

#: most padding a large tile may waste before a smaller one is preferred
MAX_PADDING = 0.25


def choose_gemm_tile(m: int, n: int, batch: int, units: int,
                     tiles: list[tuple[int, int, int]]) -> tuple[int, str]:
    """Index of the chosen tile in ``tiles`` and the reason, in words."""
    rows = []
    for i, (bm, bn, _) in enumerate(tiles):
        count = math.ceil(m / bm) * math.ceil(n / bn) * batch
        waves = math.ceil(count / units)
        padding = 1 - (m * n * batch) / (count * bm * bn)
        idle = 1 - (m * n * batch) / (waves * units * bm * bn)
        rows.append((i, bm * bn, count, waves, padding, idle))
    big = [r for r in rows if r[2] >= units and r[4] <= MAX_PADDING]
    if big:
        i, _, count, waves, padding, _ = max(big, key=lambda r: r[1])
        return i, (f"largest tile filling {units} units: {count} tiles in {waves} wave(s), "
                   f"{padding:.0%} padding")
    i, _, count, waves, _, idle = min(rows, key=lambda r: (r[3] * units * r[1], -r[1]))
    return i, (f"{count} tiles in {waves} wave(s) on {units} units, {idle:.0%} of tile slots idle "
               "(too small to fill the device with large tiles)")
