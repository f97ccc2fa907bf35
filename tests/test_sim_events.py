"""Tests for the discrete-event SM model (flashlab.sim.events).

Times are sums of exact binary fractions of small integers, so equalities are exact.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from flashlab.hardware import H100
from flashlab.sim.events import SCHEDULES, Task, Tile, simulate

ALL = [(name, build, blocks, stages) for name, build in SCHEDULES.items() for blocks in (1, 3, 6) for stages in (1, 2, 3)]


def _run(build, tile, blocks, stages):
    sched = build(tile, blocks) if build is SCHEDULES["serial"] else build(tile, blocks, stages)
    return sched, sched.run()


def test_tile_durations_come_from_the_hardware_table() -> None:
    t = Tile()
    assert t.gemm_cycles == 2 * 128**3 / H100.mma_flops_per_cycle == 1024
    assert t.softmax_cycles == 128 * 128 / H100.mufu_exp_per_cycle == 1024
    assert t.load_cycles == 2 * 128 * 128 * 2 / 32 == 2048


def test_two_tasks_by_hand() -> None:
    # b depends on a; c shares a's resource and is issued after it: c waits for a, b for a.
    tl = simulate([Task("a", "tensor", 3), Task("b", "mufu", 2, ("a",)), Task("c", "tensor", 5)])
    assert tl.rows() == [("tensor", "a", 0, 3), ("mufu", "b", 3, 5), ("tensor", "c", 3, 8)]
    assert tl.makespan == 8 and tl.utilisation("tensor") == 1.0


def test_cycle_and_bad_inputs_are_reported() -> None:
    with pytest.raises(ValueError, match="deadlock"):
        simulate([Task("a", "tensor", 1, ("b",)), Task("b", "mufu", 1, ("a",))])
    with pytest.raises(ValueError, match="resource must be one of"):
        simulate([Task("a", "gpu", 1)])
    with pytest.raises(ValueError, match="unknown"):
        simulate([Task("a", "tensor", 1, ("zz",))])


@pytest.mark.parametrize("name,build,blocks,stages", ALL)
def test_invariants(name, build, blocks, stages) -> None:
    sched, tl = _run(build, Tile(), blocks, stages)
    when = {e.task: e for e in tl.events}
    assert set(when) == {t.name for t in sched.tasks}
    for resource in ("tma", "tensor", "mufu"):   # never double-booked
        evs = sorted((e for e in tl.events if e.resource == resource), key=lambda e: e.start)
        assert all(a.end <= b.start for a, b in zip(evs, evs[1:])), f"{name}: {resource} double-booked"
    for t in sched.tasks:                        # dependencies respected
        assert all(when[d].end <= when[t.name].start for d in t.deps), f"{name}: {t.name} started early"
    assert sched.ring_occupancy(tl) <= sched.stages


@settings(max_examples=30, deadline=None)
@given(d=st.sampled_from([32, 64, 128, 256]), bw=st.sampled_from([8.0, 32.0, 128.0]), blocks=st.integers(4, 12))
def test_utilisation_ordering(d, bw, blocks) -> None:
    tile = Tile(d=d, load_bytes_per_cycle=bw)
    u = {n: b(tile, blocks).run().utilisation() for n, b in SCHEDULES.items()}
    assert u["serial"] < u["producer_consumer"] <= u["pingpong"] + 1e-12
    assert u["producer_consumer"] <= u["intra_warpgroup"] + 1e-12
    assert max(u.values()) <= 1.0


def test_headline_numbers_d128() -> None:
    u = {n: b(Tile(), 64).run().utilisation() for n, b in SCHEDULES.items()}
    assert u["serial"] == pytest.approx(2048 / 5120)                    # load + 3 x 1024, nothing overlaps
    assert u["producer_consumer"] == pytest.approx(2 / 3, abs=0.01)      # softmax still stalls the GEMMs
    assert u["pingpong"] > 0.98 and u["pingpong_intra"] > 0.98


def test_two_stage_ring_starves_intra_warpgroup() -> None:
    # With K and V in one slot, issuing S_{j+1} early needs a third slot.
    two = SCHEDULES["intra_warpgroup"](Tile(), 64, 2).run().utilisation()
    three = SCHEDULES["intra_warpgroup"](Tile(), 64, 3).run().utilisation()
    assert two < 0.7 < 0.95 < three
