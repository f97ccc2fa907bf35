"""The chapter-4 helpers around the simulator: FA2's loop order counted without a cache, and
the table that puts the paper's, the simulator's and the measured HBM bytes side by side."""

import math

import pytest

from flashlab import memory

from flashlab.lab import results


@pytest.mark.parametrize("N, d, bq", [(1024, 64, 128), (1000, 64, 128), (4096, 128, 64)])
def test_fa2_order_io_counts_q_and_o_once_and_kv_once_per_query_block(N, d, bq):
    tr = math.ceil(N / bq)
    assert memory.fa2_order_io(N, d, bq) == 2 * N * d + 2 * tr * N * d
    assert memory.fa2_order_io(N, d, N) == 4 * N * d  # one query block: every array moved once


def test_fa2_order_io_rejects_bad_sizes():
    with pytest.raises(ValueError, match="block_q"):
        memory.fa2_order_io(1024, 64, 0)


def test_hbm_table_holds_every_source():
    measured = results.load("hbm_bytes_h200")
    second_run = results.load("hbm_bytes_gpt2medium_fwdbwd_h200")
    text = memory.hbm_table(measured, second_run)
    assert "40.3" in text and "4.4" in text  # the paper's A100 figures, quoted
    for r in measured.rows:  # every measured total appears, in GB
        assert f"{r['total_bytes'] / 1e9:.2f}" in text
    flash = memory.count_flash(1024, 64, 32768).total * 2 * 64 * 16 / 1e9  # simulator, fp16, B*H = 64*16
    assert f"{flash:.2f}" in text
    with pytest.raises(ValueError, match="ns must hold"):
        memory.hbm_table(measured, ns=(2048,))
