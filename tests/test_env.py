from flashlab import env


def test_report_runs_and_names_a_tier():
    e = env.report()
    assert e.tier in env.TIERS
    text = str(e)
    assert "tier" in text and e.python in text


def test_tier_logic():
    base = dict(python="3", platform="x", cpu_count=1)
    assert env.Environment(versions={"triton": None, "torch": None}, **base).tier == 1
    assert env.Environment(versions={"triton": "3.6", "torch": "2.11"}, **base).tier == 2
    gpu = dict(versions={"triton": "3.6", "torch": "2.11"}, gpus=["A100"], **base)
    assert env.Environment(compute_capability=(8, 0), **gpu).tier == 3
    assert env.Environment(compute_capability=(9, 0), **gpu).tier == 4
    assert env.Environment(compute_capability=(10, 0), **gpu).tier == 3  # Blackwell: no wgmma, not assumed Hopper
