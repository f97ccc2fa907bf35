"""The four generations as data agree with flashlab.hardware."""

import pytest

from flashlab import generations, hardware


def test_four_generations_in_order():
    years = [g.year for g in generations.GENERATIONS]
    assert years == sorted(years) and len(years) == 4
    assert [g.arxiv for g in generations.GENERATIONS] == ["2205.14135", "2307.08691", "2407.08608", "2603.05451"]


@pytest.mark.parametrize("gen", generations.GENERATIONS, ids=lambda g: g.version)
def test_gpu_is_known_and_sources_given(gen):
    assert gen.gpu in hardware.GPUS
    assert gen.source.strip()
