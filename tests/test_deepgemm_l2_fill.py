"""benchmarks/deepgemm_l2_fill.py: the tile choice of DeepGEMM's heuristic (get_best_configs at
78cacf7) re-derived by hand for the shapes the masked-layout outliers turn on, and the fill bytes
those tiles load."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "deepgemm_l2_fill.py"


def _script():
    spec = importlib.util.spec_from_file_location("deepgemm_l2_fill", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tile_choice_follows_deepgemms_heuristic():
    s = _script()
    # 4 x 256 rows, N 4096: 2 m-blocks x 32 n-blocks x 4 groups = 256 tiles = 2 waves on 132 SMs (last 124);
    # no BLOCK_N in 16..128 gives fewer waves, 128 gives the fullest last wave; 4 groups: no multicast
    assert s.tile_config(256, 4096, 4, contiguous=False) == (128, 128, 1, 2)
    # one group of 1024 rows: the same 256 tiles, and multicast (M >= 1024, N divisible by 256)
    assert s.tile_config(1024, 4096, 1, contiguous=False) == (128, 128, 2, 2)
    # N 7168: 128 needs 56 n-blocks (448 tiles, 4 waves, last 52); 112 needs 64 (512 tiles, 4 waves, last 116)
    assert s.tile_config(256, 7168, 4, contiguous=False) == (128, 112, 1, 4)
    # M 64: BLOCK_M 64; N 2112 in one wave: the smallest BLOCK_N keeping 1 wave that fills most SMs is 16
    # (132 n-blocks: exactly 132 tiles)
    assert s.tile_config(64, 2112, 1, contiguous=False) == (64, 16, 1, 1)


def test_fill_bytes_of_the_masked_pair():
    """4 x 256 rows: 256 tiles each loading A and B (128 + 128) x 7168 bytes; one group of 1024 rows:
    the same tiles with A shared by the 2-CTA cluster (64 + 128); contiguous 4 x 8192 merges the
    groups into one of 32768 rows (multicast again): 256 x 32 tiles."""
    s = _script()
    assert s.fill_bytes("masked", 4, 256, 4096, 7168) == ((128, 128, 1, 2), 256 * 7168 * 256)
    assert s.fill_bytes("masked", 1, 1024, 4096, 7168) == ((128, 128, 2, 2), 256 * 7168 * 192)
    config, loaded = s.fill_bytes("contiguous", 4, 8192, 4096, 7168)
    assert config[:3] == (128, 128, 2) and loaded == 256 * 32 * 7168 * 192
