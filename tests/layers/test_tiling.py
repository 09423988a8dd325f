"""The shared GEMM tile heuristic (compilers' tiling per target and libraries' algorithm choice)."""

from __future__ import annotations

from fornax.layers.tiling import MAX_PADDING, choose_gemm_tile

TILES = [(128, 128, 32), (64, 64, 32), (32, 32, 16)]


def test_large_problem_gets_the_largest_tile():
    i, why = choose_gemm_tile(8192, 8192, 1, 132, TILES)
    assert TILES[i] == (128, 128, 32)                      # 4096 tiles >= 132 units, no padding
    assert "4096 tiles" in why and "32 wave(s)" in why     # ceil(4096 / 132) = 32


def test_problem_too_small_to_fill_the_device_minimises_idle_slots():
    # 64x512: 128-tiles give 4 tiles, 64-tiles 8, 32-tiles 32; none fills 132 units.
    # idle slot-area per choice: 1 wave x 132 x tile area -> the 32x32 tile wastes least
    i, why = choose_gemm_tile(64, 512, 1, 132, TILES)
    assert TILES[i] == (32, 32, 16) and "too small" in why


def test_padding_limit_steps_down_to_a_smaller_tile():
    # m = n = 1100 with 128-tiles: 9 x 9 tiles covering 1152^2 -> 8.8% padding, fine;
    # m = n = 1030: 9 x 9 tiles covering 1152^2 -> 1 - 1030^2/1152^2 = 20% padding, still fine;
    # m = n = 900 on 16 units: 128 -> 8x8 = 64 tiles, padding 1 - 900^2/1024^2 = 22.7% (< 25%)
    i, _ = choose_gemm_tile(900, 900, 1, 16, TILES)
    assert TILES[i] == (128, 128, 32)
    # m = n = 520 on 16 units: 128 -> 5x5 tiles = 25 >= 16 but padding 1 - 520^2/640^2 = 34% > 25%;
    # 64 -> 9x9 = 81 tiles, padding 1 - 520^2/576^2 = 18.5% -> the 64 tile
    assert 1 - 520 ** 2 / 640 ** 2 > MAX_PADDING
    i, _ = choose_gemm_tile(520, 520, 1, 16, TILES)
    assert TILES[i] == (64, 64, 32)


def test_batch_counts_towards_filling_the_device():
    i, _ = choose_gemm_tile(256, 256, 64, 132, TILES)      # 4 tiles x 64 batches = 256 >= 132
    assert TILES[i] == (128, 128, 32)
