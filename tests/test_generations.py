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


@pytest.mark.parametrize("gen", [g for g in generations.GENERATIONS if g.headline_flops],
                         ids=lambda g: g.version)
def test_headline_flops_recover_the_reported_share(gen):
    """Headline FLOP/s over the peak for the dtype it was measured in agrees with the reported
    utilisation to within a percentage point (the FA-4 paper rounds 71.7% down to 71%)."""
    share = gen.headline_flops / gen.hardware.peak_flops(gen.headline_dtype)
    assert abs(share - gen.utilisation[1]) < 0.01
    assert f"{gen.headline_flops / 1e12:.0f}" in gen.headline


def test_fa1_gpt2_numbers_and_shape():
    from flashlab.reference import attention_flops

    standard, flash = generations.FA1_GPT2["standard"], generations.FA1_GPT2["flash"]
    assert (standard.hbm_gb, standard.runtime_ms, flash.hbm_gb, flash.runtime_ms) == (40.3, 41.7, 4.4, 7.3)
    assert "Fig. 2" in generations.FA1_GPT2_SOURCE
    shape = generations.FA1_GPT2_SHAPE
    forward = attention_flops(shape["N"], shape["N"], shape["d"], batch=shape["batch"] * shape["heads"])
    # the documented mismatch: the forward pass alone is ~4x the paper's forward + backward GFLOPs
    assert forward / 1e9 == pytest.approx(274.9, abs=0.1) and forward / 1e9 > 4 * standard.gflops


def test_table_rows_header_and_speeds():
    """One header and four rows; the speed column recomputes each paper's share from flashlab.hardware."""
    header, *rows = generations.table_rows()
    assert len(rows) == 4 and all(len(row) == len(header) for row in rows)
    assert header[3] == "16-bit peak · HBM" and rows[2][3] == "989 TFLOP/s · 3.35 TB/s"
    assert [row[-1] for row in rows] == ["78–125 (25%–40%)", "156–228 (50%–73%)", "740 (75%)", "1613 (72%)"]
    short_header, *short_rows = generations.table_rows(with_hardware=False)
    assert "16-bit peak · HBM" not in short_header and len(short_rows[0]) == len(header) - 1


def test_table_formats():
    md = generations.table().splitlines()
    assert len(md) == 2 + 4 and md[1] == "|" + "---|" * 8
    assert all(line.startswith("| ") and line.endswith(" |") for line in md[:1] + md[2:])
    page = generations.table(fmt="html")
    assert page.startswith("<table>") and page.count("<tr>") == 5 and page.count("<th>") == 8
    assert "740 (75%)" in page and "<td>FlashAttention-4 (2026)</td>" in page
    with pytest.raises(ValueError, match="fmt must be"):
        generations.table(fmt="latex")


def test_sources_name_every_paper_and_no_seed():
    notes = generations.sources()
    for g in generations.GENERATIONS:
        assert f"arXiv:{g.arxiv}" in notes
    assert "seed" not in notes and "seed" not in generations.FA1_GPT2_SOURCE
    assert max(len(line) for line in notes.splitlines()) <= 110
