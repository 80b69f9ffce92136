"""bench/gpu_packing.py's ideal best-fit reference: the bound its printed figures are compared with."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "lab"))

import gpu_packing  # noqa: E402


def sequence(*sizes: int) -> list:
    return [gpu_packing.Job(index, size, 1) for index, size in enumerate(sizes)]


def test_best_fit_fills_the_fullest_node_that_fits_before_an_empty_one():
    # 4 -> node 0, 4 -> node 0 (leaves it full, not node 1 half), 8 -> node 1: 100 % at full demand, and the last 8
    # refused at 16/16 (spreading the two 4s would have refused the first 8 at 8/16).
    assert gpu_packing.best_fit_bound(sequence(4, 4, 8, 8), 2) == (1.0, 0.0, 0)
    # Six 4-GPU jobs on 4 nodes fill three of them: at 75 % demand (24 of 32) the fourth is still empty.
    assert gpu_packing.best_fit_bound(sequence(4, 4, 4, 4, 4, 4), 4)[2] == 1


def test_best_fit_figures_when_fragments_are_left():
    # 4 -> node 0, 2 -> node 0, 8 -> node 1, 2 -> node 0 (full demand, 16/16 allocated), 8 refused at 16/16.
    assert gpu_packing.best_fit_bound(sequence(4, 2, 8, 2, 8), 2) == (1.0, 0.0, 0)
    # 4, 2 on node 0; 1 on node 0 (7 used); 8 on node 1; demand reaches 15: 1 left unallocated; 8 refused at 15/16.
    first, full, _ = gpu_packing.best_fit_bound(sequence(4, 2, 1, 8, 8, 1), 2)
    assert (first, full) == (15 / 16, 1 / 16)
