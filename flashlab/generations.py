"""The four generations of FlashAttention, as data.

Every chapter of the book asks one question: *what is holding the computation back
right now?* Each FlashAttention paper found a different answer on a different GPU.
This module records, for each generation, the paper, the GPU it was tuned for, the
bottleneck it attacked, its answer and its headline result, with a source for the
headline. The timeline figure (:func:`flashlab.course.figures.timeline.timeline`), the
preface and the epilogue all read from here, so they never disagree.

Sources
-------
1. Dao, Fu, Ermon, Rudra, Ré. *FlashAttention: Fast and Memory-Efficient Exact
   Attention with IO-Awareness.* NeurIPS 2022. arXiv:2205.14135.
2. Dao. *FlashAttention-2: Faster Attention with Better Parallelism and Work
   Partitioning.* 2023. arXiv:2307.08691.
3. Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao. *FlashAttention-3: Fast and
   Accurate Attention with Asynchrony and Low-precision.* 2024. arXiv:2407.08608.
4. Zadouri, Hoehnerbach, Shah, Liu, Thakkar, Dao. *FlashAttention-4: Algorithm and
   Kernel Pipelining Co-Design for Asymmetric Hardware Scaling.* 2026.
   arXiv:2603.05451.

The headline numbers are the papers' own (book/seed_numbers.md lists where the
book's seed documents quote each of them). ``utilisation`` is the
share of the GPU's dense 16-bit tensor-core peak that the paper reports for the
forward pass, as a (low, high) range; for version 1 it is the figure the
FlashAttention-2 paper gives for its predecessor. ``headline_flops`` is the FLOP/s
a paper's abstract quotes, with the input type it was measured in
(``headline_dtype``), so that the share can be recomputed against
:mod:`flashlab.hardware`.

:data:`FA1_GPT2` holds the FlashAttention paper's Fig. 2 (left) measurement of
GPT-2 medium attention on an A100, the first evidence of the book (preface,
chapters 1 and 3). Its GFLOPs column does not match the shape the figure states:
4 x batch x heads x N^2 x d = 275 GFLOP for the forward pass alone, four times the
66.6 GFLOPs given for forward + backward. The book counts FLOPs from the shape and
uses the paper's column only as a ratio.

Glossary: bottleneck = the resource that limits speed (瓶颈); utilisation = achieved
FLOP/s divided by peak FLOP/s (利用率); HBM = the GPU's off-chip memory (高带宽显存).
"""

from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass

from .hardware import GPU, GPUS

__all__ = ["Generation", "GENERATIONS", "get", "speed", "table_rows", "table", "render_table", "sources",
           "PaperMeasurement", "FA1_GPT2", "FA1_GPT2_SHAPE", "FA1_GPT2_SOURCE"]


@dataclass(frozen=True)
class Generation:
    """One FlashAttention paper and the question it answered.

    Attributes
    ----------
    number : 1, 2, 3 or 4.
    version : the paper's name for it, e.g. "FlashAttention-2".
    year : year of the arXiv paper.
    title, authors, arxiv : the paper (``arxiv`` is the bare identifier).
    gpu : key into :data:`flashlab.hardware.GPUS` of the GPU the paper targets.
    bottleneck : what was holding the computation back (the question's answer).
    answer : what the paper did about it, in a few words.
    headline : the headline result, short.
    source : where the headline comes from.
    utilisation : (low, high) share of the dense 16-bit tensor peak reported.
    utilisation_source : where ``utilisation`` comes from.
    utilisation_note : a few words for a figure when ``utilisation`` is not the
        paper's own claim about itself (version 1: "as FA-2 reports"); else "".
    headline_flops : FLOP/s quoted in the paper's abstract, or None if it quotes none.
    headline_dtype : the input type ``headline_flops`` was measured in ("fp16",
        "bf16"), or None.
    """

    number: int
    version: str
    year: int
    title: str
    authors: tuple[str, ...]
    arxiv: str
    gpu: str
    bottleneck: str
    answer: str
    headline: str
    source: str
    utilisation: tuple[float, float]
    utilisation_source: str
    utilisation_note: str = ""
    headline_flops: float | None = None
    headline_dtype: str | None = None

    @property
    def url(self) -> str:
        """The paper's arXiv page."""
        return f"https://arxiv.org/abs/{self.arxiv}"

    @property
    def hardware(self) -> GPU:
        """The :class:`flashlab.hardware.GPU` this generation was tuned for."""
        return GPUS[self.gpu]

    @property
    def short_authors(self) -> str:
        """"Dao" for one author, "Dao et al." for several (first author's surname)."""
        surname = self.authors[0].split()[-1]
        return surname if len(self.authors) == 1 else f"{surname} et al."


GENERATIONS: tuple[Generation, ...] = (
    Generation(
        number=1,
        version="FlashAttention",
        year=2022,
        title="FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness",
        authors=("Tri Dao", "Daniel Y. Fu", "Stefano Ermon", "Atri Rudra", "Christopher Ré"),
        arxiv="2205.14135",
        gpu="A100",
        bottleneck="moving data",
        answer="tiling + online softmax in one fused pass; recompute in the backward",
        headline="HBM traffic 9x lower; GPT-2 attention 5.7x faster",
        source=(
            "FlashAttention paper, Fig. 2 (left): GPT-2 medium attention, N=1024, forward+backward "
            "on A100: 40.3 GB vs 4.4 GB of HBM traffic, 41.7 ms vs 7.3 ms"
        ),
        utilisation=(0.25, 0.40),
        utilisation_source="FlashAttention-2 paper, §1: FlashAttention reaches only 25-40% of the A100's peak FLOP/s",
        utilisation_note="as FA-2 reports",
    ),
    Generation(
        number=2,
        version="FlashAttention-2",
        year=2023,
        title="FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning",
        authors=("Tri Dao",),
        arxiv="2307.08691",
        gpu="A100",
        bottleneck="poor division of labour",
        answer="fewer non-matmul FLOPs; parallel over the sequence; split Q across warps",
        headline="~2x FlashAttention; 50–73% of A100 peak",
        source="FlashAttention-2 paper, abstract and §4",
        utilisation=(0.50, 0.73),
        utilisation_source="FlashAttention-2 paper, abstract: 50-73% of the theoretical maximum FLOP/s on A100",
    ),
    Generation(
        number=3,
        version="FlashAttention-3",
        year=2024,
        title="FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision",
        authors=("Jay Shah", "Ganesh Bikshandi", "Ying Zhang", "Vijay Thakkar", "Pradeep Ramani", "Tri Dao"),
        arxiv="2407.08608",
        gpu="H100",
        bottleneck="units waiting on each other",
        answer="warp specialisation, ping-pong and intra-warpgroup pipelining; FP8",
        headline="740 TFLOP/s FP16 (≈75% of H100); ≈1.2 PFLOP/s FP8",
        source="FlashAttention-3 paper, abstract and §4",
        utilisation=(0.75, 0.75),
        utilisation_source="FlashAttention-3 paper, abstract: 740 TFLOP/s FP16, 75% utilisation of H100",
        headline_flops=740e12,
        headline_dtype="fp16",
    ),
    Generation(
        number=4,
        version="FlashAttention-4",
        year=2026,
        title="FlashAttention-4: Algorithm and Kernel Pipelining Co-Design for Asymmetric Hardware Scaling",
        authors=("Ted Zadouri", "Markus Hoehnerbach", "Jay Shah", "Timmy Liu", "Vijay Thakkar", "Tri Dao"),
        arxiv="2603.05451",
        gpu="B200",
        bottleneck="the exponential unit and shared memory did not scale with the tensor cores",
        answer="software exp2 on the FMA units; conditional rescaling; TMEM and 2-CTA backward",
        headline="1613 TFLOP/s BF16 on B200 (71% of peak)",
        source="FlashAttention-4 paper, abstract",
        utilisation=(0.71, 0.71),
        utilisation_source="FlashAttention-4 paper, abstract: 1613 TFLOP/s BF16 on B200, 71% utilisation",
        headline_flops=1613e12,
        headline_dtype="bf16",
    ),
)


def get(number: int) -> Generation:
    """The generation with this ``number`` (1, 2, 3 or 4)."""
    for generation in GENERATIONS:
        if generation.number == number:
            return generation
    raise ValueError(f"number must be one of {[g.number for g in GENERATIONS]}; got {number!r}")


def speed(generation: Generation) -> str:
    """The generation's reported speed in TFLOP/s, with its share of the GPU's peak.

    FlashAttention-3 and -4 quote FLOP/s in their abstracts: divide by the dense peak of
    the input type they were measured in (``headline_flops / peak``), e.g. "740 (75%)".
    Versions 1 and 2 quote a share of the 16-bit peak: multiply it back into TFLOP/s,
    e.g. "156–228 (50%–73%)" for 50-73 % of the A100's 312 TFLOP/s."""
    gpu = generation.hardware
    if generation.headline_flops:
        share = generation.headline_flops / gpu.peak_flops(generation.headline_dtype)
        return f"{generation.headline_flops / 1e12:.0f} ({share:.0%})"
    lo, hi = generation.utilisation
    peak = gpu.peak_flops("bf16")
    return f"{lo * peak / 1e12:.0f}–{hi * peak / 1e12:.0f} ({lo:.0%}–{hi:.0%})"


def table_rows(with_hardware: bool = True) -> list[list[str]]:
    """The four generations as rows of strings, the first row being the header.

    Columns: number, paper (year), GPU, [16-bit peak · HBM bandwidth,] what held it back,
    the answer, the quoted result, and :func:`speed`. ``with_hardware`` adds the column
    computed from :mod:`flashlab.hardware`: the GPU's dense 16-bit tensor-core peak and
    its memory bandwidth."""
    header = ["", "paper", "GPU"] + (["16-bit peak · HBM"] if with_hardware else []) + [
        "what held it back", "the answer", "result (quoted)", "TFLOP/s (share of peak)"]
    rows = [header]
    for g in GENERATIONS:
        gpu = g.hardware
        hardware = [f"{gpu.peak_flops('bf16') / 1e12:.0f} TFLOP/s · {gpu.hbm_bandwidth / 1e12:.2f} TB/s"]
        rows.append([str(g.number), f"{g.version} ({g.year})", gpu.name.split()[0]]
                    + (hardware if with_hardware else []) + [g.bottleneck, g.answer, g.headline, speed(g)])
    return rows


def render_table(rows: list[list[str]], fmt: str = "html") -> str:
    """A table as one string: ``rows[0]`` is the header, each later row one line of cells.

    ``fmt="html"`` gives a ``<table>`` for ``IPython.display.HTML`` (the site shows it as a
    table whatever its Markdown settings); ``fmt="markdown"`` gives pipe-table Markdown for
    ``IPython.display.Markdown``. Cells are escaped for the format."""
    if fmt not in ("markdown", "html"):
        raise ValueError(f"fmt must be 'markdown' or 'html'; got {fmt!r}")
    header, *body = rows
    if fmt == "html":
        def html_row(row: list[str], tag: str) -> str:
            return "<tr>" + "".join(f"<{tag}>{html.escape(cell)}</{tag}>" for cell in row) + "</tr>"

        return "<table>" + html_row(header, "th") + "".join(html_row(row, "td") for row in body) + "</table>"

    def markdown_row(row: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"

    return "\n".join([markdown_row(header), "|" + "---|" * len(header)] + [markdown_row(row) for row in body])


def table(with_hardware: bool = True, fmt: str = "markdown") -> str:
    """The four-generation table of the epilogue as one string, ready for
    ``IPython.display.Markdown`` (``fmt="markdown"``) or ``IPython.display.HTML``
    (``fmt="html"``). The cells are :func:`table_rows`, rendered by :func:`render_table`;
    :func:`sources` says where each quoted result comes from."""
    return render_table(table_rows(with_hardware), fmt)


def sources(width: int = 110) -> str:
    """One note per generation: the paper (first author, year, arXiv identifier), where its
    quoted result comes from, and where its share of peak comes from; wrapped at ``width``."""
    return "\n".join(
        textwrap.fill(f"[{g.number}] {g.short_authors} ({g.year}), arXiv:{g.arxiv}. Result: {g.source}. "
                      f"Share of peak: {g.utilisation_source}.", width, subsequent_indent="    ")
        for g in GENERATIONS)


@dataclass(frozen=True)
class PaperMeasurement:
    """One column of the FlashAttention paper's Fig. 2 (left): one method, forward +
    backward of GPT-2 medium attention on an A100, in the paper's units.

    ``gflops`` is the paper's GFLOPs entry, kept as printed; it does not match the
    stated shape (see the module docstring), so use it only as a ratio."""

    method: str
    gflops: float
    hbm_gb: float
    runtime_ms: float


FA1_GPT2_SOURCE = (
    "FlashAttention paper (Dao et al., 2022), Fig. 2 (left): attention of GPT-2 medium "
    "(sequence length 1024, head dimension 64, 16 heads, batch size 64), forward + backward on an A100"
)
FA1_GPT2_SHAPE: dict[str, int] = {"batch": 64, "heads": 16, "N": 1024, "d": 64}
FA1_GPT2: dict[str, PaperMeasurement] = {
    "standard": PaperMeasurement("standard attention", gflops=66.6, hbm_gb=40.3, runtime_ms=41.7),
    "flash": PaperMeasurement("FlashAttention", gflops=75.2, hbm_gb=4.4, runtime_ms=7.3),
}
