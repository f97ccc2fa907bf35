"""The ping-pong chart from the Gluon kernel's time stamps, on a CPU: stamps to phases
(flashlab.lab.experiments.fa3_timeline) and the figure (flashlab.course.figures.fa3_timeline),
on made-up stamps. The stamped kernel itself is compiled and run in tests/test_kernels_gluon.py."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper", reason="this triton has no Gluon for Hopper")

from flashlab.kernels import fa3  # noqa: E402
from flashlab.lab.experiments import fa3_timeline as timeline  # noqa: E402

# cycles each phase lasts in the made-up run: long waits for a slot, softmax longer than a GEMM
CYCLES = {"wait_k": 20, "wait_turn": 30, "issue_s": 40, "rescale": 60, "wait_v": 20, "issue_pv": 40, "wait_s": 500,
          "softmax": 900, "wait_pv": 200, "convert": 60, "write": 300, "load_q": 50, "wait_slot_k": 1200,
          "load_k": 40, "wait_slot_v": 400, "load_v": 40, "done": 0}


def made_up_stamps(n_blocks: int, lag: int = 935, ns_per_cycle: float = 0.5) -> np.ndarray:
    """Stamps as the kernel writes them, consumer 1 ``lag`` cycles (half a block) behind
    consumer 0; the timer reads ns_per_cycle * cycles, rounded down to whole 32 ns ticks."""
    s = np.zeros((n_blocks + 1, len(fa3.STAMP_PHASES), 3, 2), dtype=np.int64)
    for part in range(3):
        c = 10_000 + (lag if part == 1 else 0)
        for j, phase in timeline.program_order(n_blocks, part):
            s[j, fa3.STAMP_PHASES.index(phase), part] = (int(c * ns_per_cycle) // 32 * 32, c)
            c += CYCLES[phase]
    return s


def test_program_order_takes_each_stamp_once():
    for part in range(3):
        order = timeline.program_order(6, part)
        assert len(order) == len(set(order))
        assert {phase for _, phase in order} <= set(fa3.STAMP_PHASES)
        assert order[-1] == (6, "done")


def test_phases_follow_the_program_order_in_microseconds():
    rows = timeline.phases(made_up_stamps(8))
    assert list(rows[0]) == list(timeline.COLUMNS)
    c0 = [r for r in rows if r["partition"] == "consumer 0"]
    assert len(c0) == len(timeline.program_order(8, 0)) - 1
    assert c0[0]["start_us"] == 0.0 and all(a["end_us"] == b["start_us"] for a, b in zip(c0, c0[1:]))
    softmax = next(r for r in c0 if r["phase"] == "softmax" and r["block"] == 3)
    assert softmax["end_us"] - softmax["start_us"] == pytest.approx(900 * 0.5e-3, rel=0.02)  # fitted clock


def test_phase_means_and_period_of_the_steady_blocks():
    rows = timeline.phases(made_up_stamps(10))
    means = timeline.phase_means(rows)
    assert means["consumer 0", "softmax"] == pytest.approx(900 * 0.5e-3, rel=0.02)
    assert means["producer", "load_k"] == pytest.approx(40 * 0.5e-3, rel=0.05)
    block = sum(CYCLES[p] for _, p in timeline.program_order(10, 0) if _ == 5) * 0.5e-3
    assert timeline.period(rows) == pytest.approx(block, rel=0.02)  # one block's phases, in a row
    with pytest.raises(ValueError, match="key blocks"):
        timeline.period(timeline.phases(made_up_stamps(3)))


def test_a_missing_stamp_is_refused():
    s = made_up_stamps(4)
    s[2, fa3.STAMP_PHASES.index("softmax"), 1] = 0
    with pytest.raises(ValueError, match="missing"):
        timeline.phases(s)


def test_interleaving_tells_pingpong_from_lockstep_and_from_one_after_the_other():
    pingpong = timeline.interleaving(timeline.phases(made_up_stamps(12)))
    assert pingpong == {"softmax_alternation": 1.0, "softmax_under_other_gemm": 1.0}
    after = timeline.interleaving(timeline.phases(made_up_stamps(12, lag=10**6)))  # consumer 1 starts late
    assert after["softmax_alternation"] < 0.2 and after["softmax_under_other_gemm"] == 0.0


def test_softmax_overlap_is_zero_taking_turns_and_one_in_lockstep():
    turns = timeline.phases(made_up_stamps(12))  # consumer 1 half a block (935 cycles) behind
    half = timeline.phases(made_up_stamps(12, lag=450))  # half of a 900-cycle softmax
    lockstep = timeline.phases(made_up_stamps(12, lag=0))
    assert timeline.softmax_overlap(turns) == 0.0
    assert timeline.softmax_overlap(half) == pytest.approx(0.5, abs=0.02)
    assert timeline.softmax_overlap(lockstep) == pytest.approx(1.0, abs=0.02)
    assert timeline.softmax_overlap(timeline.phases(made_up_stamps(12, lag=10**6))) == 0.0
    with pytest.raises(ValueError, match="key blocks"):
        timeline.softmax_overlap(timeline.phases(made_up_stamps(3)))


def _small_text(fig) -> list[tuple[str, float]]:
    from matplotlib.text import Text

    fig.canvas.draw()
    return [(t.get_text()[:30], t.get_fontsize()) for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip() and t.get_fontsize() < 9.0]


def test_figure_draws_the_recorded_stamps_beside_the_simulator(tmp_path):
    import matplotlib.pyplot as plt

    from flashlab.course.figures.fa3_timeline import STEM, pingpong_measured
    from flashlab.lab.results import write

    meta = {k: "made up" for k in ("gpu", "driver", "torch", "triton", "date", "command", "commit")}
    write(STEM, timeline.phases(made_up_stamps(16)), meta, tmp_path)
    fig = pingpong_measured(results_dir=tmp_path)
    top, bottom = fig.axes
    assert top.get_title(loc="left").startswith("simulator") and bottom.get_title(loc="left").startswith("measured")
    assert top.get_xlim() == bottom.get_xlim(), "one time axis"
    labels = {t.get_text() for t in bottom.texts}
    assert {"S8", "e8", "O8"} <= labels, labels
    assert not _small_text(fig)
    assert fig.get_figwidth() <= 7.8
    plt.close(fig)


def test_figure_without_recorded_stamps_shows_the_simulator_and_says_how_to_measure(tmp_path):
    import matplotlib.pyplot as plt

    from flashlab.course.figures.fa3_timeline import pingpong_measured

    fig = pingpong_measured(results_dir=tmp_path)
    top, bottom = fig.axes
    assert top.get_title(loc="left").startswith("simulator")
    assert any("fa3timeline" in t.get_text() for t in bottom.texts)
    assert not _small_text(fig)
    plt.close(fig)


def test_gemm_time_matches_the_simulators_at_the_same_rate():
    from flashlab.course.figures.fa3_timeline import simulated_timeline
    from flashlab.hardware import H100

    g0 = next(e.end - e.start for e in simulated_timeline()[0] if e.kind == "G0")
    assert timeline.gemm_us(H100.peak_flops("fp16") / 1e12, 4) == pytest.approx(4 * g0, rel=1e-3)
    assert timeline.gemm_us(400.0) == pytest.approx(2 * timeline.gemm_us(800.0))


@pytest.mark.parametrize("p_smem, blocks", [(False, 16), (True, 8)])
def test_stamped_fp8_forward_sizes_its_stamps_by_the_build_it_asks_for(monkeypatch, p_smem, blocks):
    """stamped_fp8_forward hands p_smem to the kernel and gives it one stamp row per key block of
    that build (2048 keys: 16 blocks of 128, or 8 of 256) plus the final one."""
    import torch

    from flashlab.kernels import fa3_fp8

    calls = []
    monkeypatch.setattr(fa3_fp8, "forward", lambda **kw: calls.append(kw) or (None, None))
    pre = {"q": torch.zeros(2, 4, 2048, 128), "k": torch.zeros(2, 4, 2048, 128)}
    _, _, stamps = timeline.stamped_fp8_forward(pre, at=(3, 4), p_smem=p_smem)
    (kw,) = calls
    assert kw["p_smem"] is p_smem and kw["stamps"] is stamps
    assert stamps.shape == (blocks + 1, len(timeline.fa3.STAMP_PHASES), 3, 2)
    assert kw["stamp_at"] == 3 + 4 * 16  # (query tile, batch-head); 2048 / (2 * 64) query tiles a head
