"""Every number stated in the seed documents, and where the book checks it.

``python -m flashlab.course.claims book/seed_numbers.md`` writes the appendix page
"Every number in the seed documents" from the list ``CLAIMS`` below.

Each :class:`Claim` is one number (or one small group of numbers that always travel
together) stated in a seed document, in our own words, with:

status
    ``"reproduced"``  a notebook computes it and prints it (``shown`` is the printed text);
    ``"modelled"``    a model in the book explains it (a simulator, a cycle count, a proof);
    ``"quoted"``      the book quotes it, labelled as a quotation;
    ``"differs"``     the book measured or computed something else (``ours`` says what, ``note`` why);
    ``"not covered"`` the book does not mention it yet (``chapter`` says where it belongs).
where
    ``(notebook file name, anchor)``: the anchor is a string that occurs in that
    notebook's cell sources or outputs, where the number appears.
num
    the seed's value as a Python number literal written to the seed's precision
    (``"1.135"``, ``"16.8e6"``, ``"2e2"`` for "about 200"), or a range ``"25..40"``.

tests/test_claims.py checks that every anchor exists, that every reproduced number is
printed in its notebook's outputs to the seed's precision, and that the committed page
equals what this module writes.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CHAPTERS", "CLAIMS", "Claim", "STATUSES", "SEEDS", "render", "significant_digits"]

STATUSES = ("reproduced", "modelled", "quoted", "differs", "not covered")

#: The four Chinese source documents the book was written from (its seeds), by the short name
#: used in ``source``.
SEEDS = {
    "S0": "000_af340efeeb369663.txt: the small book on four FlashAttention generations",
    "S1": "001_ceffb207d83b80e3.txt: an article on FlashAttention-3",
    "S2": "002_d11146fc1d179879.txt: interview notes on FlashAttention v1-v3",
    "S4": "004_a1f51bbf1cea711d.txt: paper notes on FlashAttention v1-v3",
}

#: Notebook stem -> heading on the generated page, in book order.
CHAPTERS = {
    "00_preface": "Preface",
    "01_naive_attention": "1. Naive attention",
    "02_online_softmax": "2. Online softmax",
    "03_flashattention_v1": "3. FlashAttention (v1)",
    "04_io_complexity": "4. IO complexity",
    "05_flashattention2": "5. FlashAttention-2",
    "06_flashattention3": "6. FlashAttention-3",
    "07_flashattention4": "7. FlashAttention-4",
    "08_epilogue": "8. Epilogue",
}


@dataclass(frozen=True)
class Claim:
    id: str
    chapter: str                       # notebook stem where the number belongs
    claim: str                         # one sentence, our words
    seed: str                          # the value as the seed writes it
    num: str | None                    # the value as a number literal ("1.135") or range ("25..40")
    source: str                        # seed short name + section, and the paper it cites
    status: str
    where: tuple[str, str] | None = None   # (notebook file name, anchor string)
    shown: str | None = None           # reproduced: the number exactly as the notebook prints it
    ours: str | None = None            # differs: our value
    note: str = ""

    @property
    def value(self) -> float | tuple[float, float] | None:
        """The seed's value as a float, or (low, high) for a range."""
        if self.num is None:
            return None
        if ".." in self.num:
            lo, hi = self.num.split("..")
            return float(lo), float(hi)
        return float(self.num)


def significant_digits(num: str) -> int:
    """Significant digits of a number literal: "1.135" -> 4, "16.8e6" -> 3, "2e2" -> 1, "0.125" -> 3."""
    mantissa = num.lower().split("e")[0].lstrip("+-").replace(".", "").lstrip("0")
    return max(len(mantissa), 1)


def round_sig(x: float, digits: int) -> float:
    """x rounded to `digits` significant digits."""
    if x == 0:
        return 0.0
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


FA1 = "FlashAttention paper (Dao et al., 2022)"
FA2 = "FlashAttention-2 paper (Dao, 2023)"
FA3 = "FlashAttention-3 paper (Shah et al., 2024)"
FA4 = "FlashAttention-4 paper (Zadouri et al., 2026)"

_C = Claim
CLAIMS: list[Claim] = [
    # ---------------------------------------------------------------- preface
    _C("timeline", "00_preface",
       "The four generations appeared in 2022, 2023, 2024 and 2026, on the A100, A100, H100 and B200.",
       "2022 / 2023 / 2024 / 2026", None, "S0 foreword and epilogue table", "quoted",
       ("00_preface.ipynb", "FlashAttention-3 | 2024 | H100")),
    _C("fa3_requirements", "00_preface",
       "Using FA3 from Python needs an SM 9.0 GPU, CUDA 12.1 or later, PyTorch 2.3.0 or later, and flash-attn 2.5.0 or later for the standalone library.",
       "SM 9.0, CUDA ≥ 12.1, PyTorch ≥ 2.3.0, flash-attn ≥ 2.5.0", None, "S1 §6.1", "not covered",
       note="software prerequisites that go stale, not a property of the algorithm; the preface points to flash-attn's own installation notes instead"),

    # ---------------------------------------------------------------- chapter 1
    _C("head_dim", "01_naive_attention",
       "The head dimension d is usually 64 or 128.", "64 or 128", None, "S0 §1.2", "quoted",
       ("01_naive_attention.ipynb", "64 or 128")),
    _C("score_bytes_8192", "01_naive_attention",
       "At N = 8192 one head's score matrix has about 67 million entries, 134 MB in fp16.",
       "约 6700 万个数, 134 MB", "134", "S0 §1.2", "reproduced",
       ("01_naive_attention.ipynb", "134.2 MB"), shown="134.2"),
    _C("score_quadruples", "01_naive_attention",
       "Doubling N makes the N × N matrix four times larger.", "4×", "4", "S0 §1.2", "modelled",
       ("04_io_complexity.ipynb", "FlashAttention's extra memory doubles (linear)")),
    _C("scores_4096_128k", "01_naive_attention",
       "At N = 4096 the score matrix has 16 million entries, at 128K about 16.3 billion.",
       "1600 万 / 163 亿", "16.3e9", "S1 §1.1", "differs",
       ("01_naive_attention.ipynb", "$131{,}072^2 \\approx 17.2$ billion"),
       ours="16.8 million at N = 4096 and 17.2e9 at N = 131,072",
       note="the seed reads 128K as 128,000 (128,000² = 16.38e9, cut to 16.3); the chapter counts 128K = 131,072"),
    _C("a100_hbm_capacity", "01_naive_attention",
       "The A100's HBM holds 40 to 80 GB.", "40–80 GB", "40..80", f"S0 §1.3, S4; {FA1} §2.1", "quoted",
       ("01_naive_attention.ipynb", "FlashAttention §2.1: 40-80 GB")),
    _C("a100_hbm_bandwidth", "01_naive_attention",
       "The A100's HBM moves 1.5 to 2.0 TB/s.", "1.5–2.0 TB/s", "1.5..2.0", f"S0 §1.3, S4; {FA1} §2.1", "quoted",
       ("01_naive_attention.ipynb", "FlashAttention §2.1: 1.5-2.0 TB/s")),
    _C("a100_sms", "01_naive_attention",
       "The A100 has 108 streaming multiprocessors.", "108", "108", "S0 §1.3, §3.1", "quoted",
       ("01_naive_attention.ipynb", "108 \\times 192")),
    _C("a100_sram_per_sm", "01_naive_attention",
       "Each A100 SM has 192 KB of on-chip SRAM.", "192 KB", "192", f"S0 §1.3, S4; {FA1} §2.1", "quoted",
       ("01_naive_attention.ipynb", "192 KB of on-chip SRAM per SM")),
    _C("a100_sram_total", "01_naive_attention",
       "The A100's SRAM adds up to about 20 MB.", "约 20 MB", "20", f"S0 §1.3, S2; {FA1} §2.1", "differs",
       ("01_naive_attention.ipynb", "The paper rounds"), ours="108 × 192 KB = 21.2 MB (20.25 MiB)",
       note="the paper rounds; nothing in the book depends on the difference"),
    _C("a100_sram_bandwidth", "01_naive_attention",
       "On-chip SRAM bandwidth is estimated at about 19 TB/s, an order of magnitude above HBM.",
       "约 19 TB/s", "19", f"S0 §1.3, S2, S4; {FA1} §2.1", "quoted",
       ("01_naive_attention.ipynb", "SRAM moves data about **12 times faster**"),
       note="the book divides 19 TB/s by the A100's 1.555 TB/s: about 12×"),
    _C("h100_smem", "01_naive_attention",
       "An H100 SM has about 228 KB of shared memory.", "约 228KB", "228", "S1 §1.2", "quoted",
       ("01_naive_attention.ipynb", "(up to 228 KB)")),
    _C("hbm_3tbs", "01_naive_attention",
       "HBM holds about 80 GB and moves about 3 TB/s (an H100).", "~80GB, ~3 TB/s", "3", "S2 table, S1 §1.2", "quoted",
       ("08_epilogue.ipynb", "989 TFLOP/s · 3.35 TB/s"), note="the book's H100 SXM: 3.35 TB/s"),
    _C("a100_tensor_peak", "01_naive_attention",
       "The A100 does 312 TFLOP/s of 16-bit matrix arithmetic.", "312 TFLOPS", "312", "S0 §1.4, §3.2", "quoted",
       ("01_naive_attention.ipynb", "312 TFLOPS dense FP16/BF16 tensor")),
    _C("a100_ridge", "01_naive_attention",
       "312 TFLOP/s over 1.5 TB/s means about 200 FLOPs per byte before the A100 is compute-bound.",
       "大约 200 次运算", "2e2", "S0 §1.4", "reproduced",
       ("01_naive_attention.ipynb", "= 201 FLOP/B"), shown="201"),
    _C("standard_four_trips", "01_naive_attention",
       "Standard attention moves the two N × N matrices in and out of HBM four times.",
       "进出了四趟", "4", "S0 §1.4", "modelled",
       ("04_io_complexity.ipynb", "Standard attention pays **four** $N^2$ trips"),
       note="the IO simulator counts about 5 N² moves at N = 16384 (the four trips plus Q, K, V, O)"),
    _C("fused_speedup_10x", "01_naive_attention",
       "FlashAttention-2 is up to 10 times faster than a standard implementation on long sequences.",
       "快 10 倍", "10", "S4 (what is FlashAttention)", "differs",
       ("01_naive_attention.ipynb", "fused kernels are 1.3 to 10 times faster"),
       ours="1.3–10× (H200, PyTorch's flash 3.8–6.9× and cuDNN 5.6–10.3× at d = 64, forward)",
       note="measured on an H200 against naive PyTorch; the 10× is reached by cuDNN, not by the FA2 kernel"),
    _C("fa1_speedup_2_4", "03_flashattention_v1",
       "FlashAttention v1 is 2 to 4 times faster than standard attention.", "2~4 倍", "2..4", "S1 §2.1, S4 (v2 intro)",
       "quoted", ("03_flashattention_v1.ipynb", "2–4× faster than optimised standard attention")),

    # ---------------------------------------------------------------- chapter 2
    _C("fp16_max", "02_online_softmax",
       "The largest finite fp16 number is 65504.", "65504", "65504", "S0 §2.1", "reproduced",
       ("02_online_softmax.ipynb", "largest finite float16: 65504"), shown="65504"),
    _C("exp_overflow", "02_online_softmax",
       "e^11.1 already exceeds the fp16 maximum.", "e^{11.1}", "11.1", "S0 §2.1", "reproduced",
       ("02_online_softmax.ipynb", "ln of it =  11.0899"), shown="11.0899",
       note="the threshold is ln 65504 = 11.09; e^11.1 = 66171 overflows to inf in fp16"),
    _C("worked_l1", "02_online_softmax",
       "For the row [1, 3, 2, 5] in blocks [1, 3] and [2, 5], the denominator after the first block is 1.135.",
       "ℓ = 1.135", "1.135", "S0 §2.2 (figure 4)", "reproduced",
       ("02_online_softmax.ipynb", "after block 1: m = 3, l = 1.1353"), shown="1.1353"),
    _C("worked_l2", "02_online_softmax",
       "After the second block the rescaled denominator is 1.204.", "ℓ = 1.204", "1.204", "S0 §2.2 (figure 4)",
       "differs", ("02_online_softmax.ipynb", "after block 2: m = 5, l = 1.2034"), ours="1.2034 (1.203 to three decimals)",
       note="exactly 1.20344; the seed rounds 1.135 first and then rounds up"),

    # ---------------------------------------------------------------- chapter 3
    _C("stats_2n", "03_flashattention_v1",
       "The backward pass keeps 2N numbers (m and ℓ per row) instead of the N × N matrix P.",
       "只存 2N 个数", None, f"S0 §2.4; {FA1} §3.1", "reproduced",
       ("03_flashattention_v1.ipynb", "m, l =  16.00 MiB   ratio   4096x")),
    _C("gpt2_flops", "03_flashattention_v1",
       "GPT-2 medium attention (N = 1024, A100, forward + backward) does 66.6 GFLOPs standard and 75.2 GFLOPs with FlashAttention.",
       "66.6 / 75.2 GFLOPs", "66.6", f"S0 §2.4; {FA1} Fig. 2", "differs",
       ("01_naive_attention.ipynb", "One column does not add up"),
       ours="824.6 / 962.1 GFLOP counted from the stated shape (forward alone 274.9)",
       note="the paper does not say how it counted; the book uses its column only as a ratio (1.13 against our 1.17)"),
    _C("gpt2_flops_more", "03_flashattention_v1",
       "Recomputation makes FlashAttention do 13 % more arithmetic in that run.", "多了 13%", "13", f"S0 §2.4; {FA1} Fig. 2",
       "differs", ("03_flashattention_v1.ipynb", "16.7 % more arithmetic"), ours="16.7 %",
       note="counted from the shape: one extra 2N²d matmul on top of 12N²d"),
    _C("gpt2_hbm", "03_flashattention_v1",
       "In that run standard attention reads and writes 40.3 GB of HBM, FlashAttention 4.4 GB.",
       "40.3 GB / 4.4 GB", "40.3", f"S0 §2.4; {FA1} Fig. 2", "differs",
       ("01_naive_attention.ipynb", "naive attention moved **40.33 GB**"),
       ours="40.33 GB / 3.27 GB (H200, Nsight Compute via flashlab.lab.ncu; flashlab's own kernel 2.28 GB)",
       note="measured on an H200 with PyTorch's flash backend (an FA2) and flashlab's kernel, not FA1 on an A100; the paper's pair is printed beside it"),
    _C("gpt2_hbm_ratio", "03_flashattention_v1",
       "FlashAttention moves about nine times fewer bytes.", "搬运少了 9 倍", "9", f"S0 §2.4; {FA1} Fig. 2", "quoted",
       ("01_naive_attention.ipynb", "moves nine times fewer bytes")),
    _C("gpt2_runtime", "03_flashattention_v1",
       "That run takes 41.7 ms standard and 7.3 ms with FlashAttention, 5.7 times faster.",
       "41.7 ms / 7.3 ms, 5.7 倍", "5.7", f"S0 §2.4; {FA1} Fig. 2", "quoted",
       ("03_flashattention_v1.ipynb", "41.7 → 7.3 ms")),
    _C("fa1_memory_20x", "03_flashattention_v1",
       "Attention memory becomes linear in N, up to 20 times less than exact-attention baselines.",
       "最多省 20 倍", "20", f"S0 §2.6, S4; {FA1} §4", "quoted",
       ("03_flashattention_v1.ipynb", "up to 20× less than exact-attention baselines")),
    _C("bert_mlperf", "03_flashattention_v1",
       "BERT-large (N = 512) trains 15 % faster than the MLPerf 1.1 record.", "快 15%", "15",
       f"S0 §2.6, S4; {FA1} §4.1", "quoted", ("03_flashattention_v1.ipynb", "trained 15 % faster than the MLPerf 1.1")),
    _C("gpt2_hf", "03_flashattention_v1",
       "GPT-2 (N = 1K) trains up to 3 times faster than the HuggingFace implementation.", "最多 3 倍", "3",
       f"S0 §2.6, S4; {FA1} §4.1", "quoted", ("03_flashattention_v1.ipynb", "up to 3× faster than the HuggingFace")),
    _C("gpt2_megatron", "03_flashattention_v1",
       "GPT-2 trains up to 1.7 times faster than Megatron-LM.", "1.7 倍", "1.7", f"S4; {FA1} §4.1", "quoted",
       ("03_flashattention_v1.ipynb", "1.7× faster than Megatron-LM")),
    _C("lra", "03_flashattention_v1",
       "Long Range Arena runs 2.4 times faster.", "2.4 倍", "2.4", f"S0 §2.6, S4; {FA1} §4.1", "quoted",
       ("03_flashattention_v1.ipynb", "2.4×")),
    _C("path_x", "03_flashattention_v1",
       "On Path-X (N = 16K) a Transformer reaches 61.4 % accuracy, the first above chance (50 %).", "61.4%", "61.4",
       f"S0 §2.6; {FA1} §4.2", "quoted", ("03_flashattention_v1.ipynb", "61.4 % accuracy")),
    _C("path_256", "03_flashattention_v1",
       "Block-sparse FlashAttention reaches 63.1 % on Path-256 (N = 64K).", "63.1%", "63.1", f"S0 §2.6; {FA1} §4.2",
       "quoted", ("03_flashattention_v1.ipynb", "63.1 % on Path-256")),

    # ---------------------------------------------------------------- chapter 4
    _C("io_orders", "04_io_complexity",
       "Standard attention moves Θ(Nd + N²) elements, FlashAttention Θ(N²d²/M).", "Θ(Nd+N²) / Θ(N²d²/M)", None,
       f"S0 §2.5; {FA1} Theorem 2", "reproduced", ("04_io_complexity.ipynb", "both are quadratic"),
       note="simulated counts swept over N, d and M and fitted against the formulas"),
    _C("io_orders_s2", "04_io_complexity",
       "FlashAttention's HBM traffic falls from O(N²) to about O(N²/M).", "约 O(N²/M)", None, "S2 (complexity)",
       "differs", ("04_io_complexity.ipynb", "| back of envelope | N² = 16,777,216"), ours="Θ(N²d²/M)",
       note="the interview notes drop the factor d²; the paper's Theorem 2 and the simulator keep it"),
    _C("io_example_standard", "04_io_complexity",
       "For N = 4096, d = 64, M = 32768, standard attention moves about 16.8 million elements (N²).",
       "约 1680 万个数", "16.8e6", "S0 §2.5", "reproduced",
       ("04_io_complexity.ipynb", "| back of envelope | N² = 16,777,216 |"), shown="16,777,216"),
    _C("io_example_flash", "04_io_complexity",
       "In the same example FlashAttention moves about 2.1 million elements (N²d²/M).",
       "约 210 万个数", "2.1e6", "S0 §2.5", "reproduced",
       ("04_io_complexity.ipynb", "N²d²/M = 2,097,152 | d²/M = 0.125 |"), shown="2,097,152"),
    _C("io_example_ratio", "04_io_complexity",
       "The ratio of the two is d²/M = 4096/32768 = 1/8.", "1/8", "0.125", "S0 §2.5", "reproduced",
       ("04_io_complexity.ipynb", "| d²/M = 0.125 |"), shown="0.125",
       note="the simulator, counting constants, gives 0.314"),
    _C("io_example_passes", "04_io_complexity",
       "A Q block holds about M/d = 512 rows, so Q splits into 8 blocks and K, V are read 8 times, about 262,144 (Nd) elements each time.",
       "512 行, 8 块, 8 遍, 约 26 万", "512", "S0 §2.5", "modelled",
       ("04_io_complexity.ipynb", "A $Q$ block holds about $M/d$ rows")),
    _C("io_9x", "04_io_complexity",
       "Counting constants, the paper finds up to about 9 times fewer HBM accesses.", "最多减少到约九分之一", "9",
       f"S0 §2.5; {FA1} §3.2", "differs", ("04_io_complexity.ipynb", "| simulated | 84,410,368 | 26,484,736 | 0.314 |"),
       ours="3.2× fewer (ratio 0.314) in the simulator at N = 4096, d = 64, M = 32768; on an H200, forward + backward at the GPT-2-medium shape, 12× (naive 40.33 GB vs SDPA flash 3.27 GB) and 18× (vs flashlab 2.28 GB)",
       note="the 9× depends on the SRAM size and the shape; the book's example uses a small M"),
    _C("io_linear_memory", "04_io_complexity",
       "FlashAttention's memory is linear in N but its traffic still grows with N²; it saves a constant factor M/d².",
       "省下常数倍 M/d²", None, "S0 §2.5", "reproduced",
       ("04_io_complexity.ipynb", "Memory grows linearly, IO still grows quadratically")),
    _C("io_d2_lt_m", "04_io_complexity",
       "With d = 64–128 and an SRAM of tens of thousands to over a hundred thousand numbers, d² < M holds.",
       "d 为 64–128", "64..128", "S0 §2.5", "modelled",
       ("04_io_complexity.ipynb", "For the head dimensions models use (64 to 128)")),
    _C("io_lower_bound", "04_io_complexity",
       "No exact attention algorithm does asymptotically fewer than N²d²/M HBM accesses for every M in a range.",
       "下界", None, f"S0 §2.5; {FA1} Proposition 3", "modelled",
       ("04_io_complexity.ipynb", "The lower bound: what Proposition 3 proves")),

    # ---------------------------------------------------------------- chapter 5
    _C("fa1_utilisation", "05_flashattention2",
       "FlashAttention v1 reaches only 25–40 % of the A100's peak.", "25%–40%", "25..40",
       f"S0 §3.1, S4; {FA2} §1", "quoted", ("05_flashattention2.ipynb", "share of A100 peak  25%-40%"),
       note="chapter 3 computes 42 % from the paper's GPT-2 run with the book's FLOP count"),
    _C("fa1_utilisation_s1", "05_flashattention2",
       "On the A100, v1 uses about 30 % of the compute and v2 about 50 %.", "30% 左右 / 50% 左右", "30", "S1 §2.2",
       "quoted", ("05_flashattention2.ipynb", "about 30 % of the A100's compute for v1 and about 50 % for v2"),
       note="rounder figures than S0's 25–40 % and 50–73 %; quoted beside the paper's ranges"),
    _C("gemm_utilisation", "05_flashattention2",
       "A well-optimised matrix multiply reaches 80–90 % of peak.", "80%–90%", "80..90", f"S0 §3.1; {FA2} §1",
       "quoted", ("05_flashattention2.ipynb", "share of A100 peak     80%-90%")),
    _C("warp_32", "05_flashattention2",
       "A warp is 32 threads that execute together.", "32 个线程", "32", "S0 §3.1", "quoted",
       ("05_flashattention2.ipynb", "warps** of 32 threads")),
    _C("warps_per_block", "05_flashattention2",
       "A thread block is split into 4 or 8 warps.", "4 个或 8 个 warp", None, "S0 §3.4", "quoted",
       ("05_flashattention2.ipynb", "A program typically has 4 or 8 warps")),
    _C("nonmatmul_19_5", "05_flashattention2",
       "Non-matmul fp32 arithmetic on the A100 runs at 19.5 TFLOP/s.", "19.5 TFLOPS", "19.5", f"S0 §3.2; {FA2} §3.1",
       "quoted", ("05_flashattention2.ipynb", "19.5 TFLOPS FP32")),
    _C("nonmatmul_16x", "05_flashattention2",
       "One non-matmul operation costs as much as 16 matmul operations (312 / 19.5).", "16 次", "16",
       f"S0 §3.2; {FA2} §3.1", "reproduced",
       ("05_flashattention2.ipynb", "one non-matmul op takes as long as 16 matmul FLOPs"), shown="16"),
    _C("idle_sms", "05_flashattention2",
       "With batch 1 and 16 heads, v1 launches 16 thread blocks and leaves 92 of the A100's 108 SMs idle.",
       "92 个在发呆", "92", "S0 §3.3", "modelled",
       ("05_flashattention2.ipynb", "v1 keeps 16 SMs busy and 92 idle")),
    _C("fa2_2x", "05_flashattention2",
       "FlashAttention-2 is about twice as fast as v1.", "约 2 倍", "2", f"S0 §3.5, S2; {FA2} abstract", "quoted",
       ("08_epilogue.ipynb", "~2x FlashAttention")),
    _C("fa2_vs_fa1_range", "05_flashattention2",
       "FlashAttention-2 is 1.7–3.0 times faster than v1 and 1.3–2.5 times faster than the Triton implementation.",
       "1.7-3.0 倍 / 1.3-2.5 倍", "1.7..3.0", f"S4; {FA2} §4", "quoted",
       ("05_flashattention2.ipynb", "1.7–3.0 times as fast as FlashAttention")),
    _C("fa2_forward_share", "05_flashattention2",
       "The FA2 forward pass reaches 50–73 % of the A100's peak.", "50%–73%", "50..73", f"S0 §3.5; {FA2} abstract",
       "quoted", ("05_flashattention2.ipynb", "forward pass, share of A100 peak")),
    _C("fa2_forward_230", "05_flashattention2",
       "Its best forward pass reaches 230 TFLOP/s, 73 % of the A100's peak.", "230 TFLOPs/s", "2.3e2", f"S4; {FA2} §4.1",
       "reproduced", ("08_epilogue.ipynb", "156–228 (50%–73%)"), shown="228",
       note="the epilogue multiplies 73 % by 312 TFLOP/s"),
    _C("fa2_backward_63", "05_flashattention2",
       "The FA2 backward pass reaches 63 % of the A100's peak.", "63%", "63", f"S4; {FA2} §4.1", "quoted",
       ("05_flashattention2.ipynb", "backward pass reached up to 63 %")),
    _C("fa2_training_225", "05_flashattention2",
       "End-to-end GPT training with FA2 reaches 225 TFLOP/s per A100.", "225 TFLOPS", "225", f"S0 §3.5; {FA2} §4.2",
       "quoted", ("05_flashattention2.ipynb", "end-to-end GPT training, per A100       225 TFLOP/s")),
    _C("fa2_mfu_72", "05_flashattention2",
       "That is 72 % model FLOPs utilisation.", "72%", "72", f"S0 §3.5; {FA2} §4.2", "reproduced",
       ("05_flashattention2.ipynb", "225 TFLOP/s / 312 TFLOP/s = 72%"), shown="72"),

    # ---------------------------------------------------------------- chapter 6
    _C("h100_peak", "06_flashattention3",
       "The H100 does 989 TFLOP/s of 16-bit matrix arithmetic.", "989 TFLOPS", "989", f"S0 §4.1; {FA3}",
       "reproduced", ("06_flashattention3.ipynb", "tensor cores, fp16:   989.4 TFLOP/s"), shown="989.4",
       note="datasheet value; flashlab.hardware derives the 1.83 GHz clock from it (÷ 132 SMs × 4096 FLOPs/cycle)"),
    _C("h100_vs_a100", "06_flashattention3",
       "That is more than three times the A100's.", "三倍多", "3", "S0 §4.1", "reproduced",
       ("03_flashattention_v1.ipynb", "H200 989 TFLOP/s vs A100 312 TFLOP/s (3.2x)"), shown="3.2",
       note="printed for the H200, whose tensor cores equal the H100's"),
    _C("fa2_on_h100", "06_flashattention3",
       "FlashAttention-2 uses only about 35 % of the H100's peak.", "35%", "35", f"S0 §4.1, S1, S4; {FA3} §1",
       "quoted", ("06_flashattention3.ipynb", "reaches only about 35 % of the GPU's peak")),
    _C("warpgroup", "06_flashattention3",
       "A warpgroup is 4 warps, 128 threads.", "4 个 warp, 共 128 个线程", "128", "S0 §4.1", "quoted",
       ("06_flashattention3.ipynb", "a *warpgroup* is 4 warps, 128 threads")),
    _C("fp8_2x", "06_flashattention3",
       "FP8 doubles the tensor cores' matrix-multiply rate.", "再翻一倍", "2", "S0 §4.1, S1", "quoted",
       ("06_flashattention3.ipynb", "FP8 doubles the tensor core's speed (1979 vs 989")),
    _C("h100_exp_rate", "06_flashattention3",
       "The H100's special-function units evaluate about 3.9 trillion exponentials per second.", "3.9 万亿次",
       "3.9", f"S0 §4.2; {FA3} §3", "quoted", ("06_flashattention3.ipynb", "about 3.9 trillion exponentials per second")),
    _C("exp_256x", "06_flashattention3",
       "One exponential costs as much time as 256 matrix FLOPs.", "相差 256 倍", "256", f"S0 §4.2; {FA3} §3",
       "reproduced", ("06_flashattention3.ipynb", "one exp costs the time of 256 matrix FLOPs"), shown="256"),
    _C("exp_512x", "06_flashattention3",
       "At d = 128 attention does 512 times more matrix FLOPs than exponentials.", "512 倍", "512",
       f"S0 §4.2; {FA3} §3", "reproduced",
       ("06_flashattention3.ipynb", "attention does 512 matrix FLOPs per exp at d = 128"), shown="512"),
    _C("exp_half", "06_flashattention3",
       "So the exponentials take half as long as the matrix multiplies.", "256 ÷ 512 = 1/2", "0.5", "S0 §4.2",
       "reproduced", ("06_flashattention3.ipynb", "exp time / matrix time = 256 / 512 = 0.50"), shown="0.50"),
    _C("serial_idle_third", "06_flashattention3",
       "Run one after the other, the tensor cores wait about a third of the time.", "大约三分之一", "0.33",
       "S0 §4.2", "modelled", ("06_flashattention3.ipynb", "waits $\\tfrac12$ unit"),
       note="busy 1 unit, idle ½: idle 1/3 of the time; the simulator adds loads (busy 0.40 serial)"),
    _C("pingpong_570_640", "06_flashattention3",
       "Ping-pong scheduling alone lifts FP16, d = 128, N = 8K from 570 to 620–640 TFLOP/s.", "570 → 620–640",
       "620..640", f"S0 §4.4; {FA3} §3.1", "quoted",
       ("06_flashattention3.ipynb", "ping-pong alone lifted a kernel from 570 to 620–640 TFLOP/s")),
    _C("ablation_661", "06_flashattention3",
       "The full FA3 forward runs at 661 TFLOP/s in the ablation.", "661", "661", f"S0 §4.5; {FA3} §4.2",
       "modelled", ("06_flashattention3.ipynb", "predicts about 700 against the paper's 661"),
       note="the three-unit simulator predicts 982; scaled by the measured bf16 matmul ceiling (699 TFLOP/s) about 700"),
    _C("ablation_582", "06_flashattention3",
       "Without intra-warpgroup pipelining it runs at 582 TFLOP/s.", "582", "582", f"S0 §4.5; {FA3} §4.2",
       "differs", ("06_flashattention3.ipynb", "No GEMM-Softmax Pipelining, Warp-Specialization"),
       ours="982 TFLOP/s (simulator, ping-pong only)",
       note="the model gets the ordering, not the levels: it omits non-exp softmax work, register limits and latency"),
    _C("ablation_570", "06_flashattention3",
       "Without warp specialisation it runs at 570 TFLOP/s.", "570", "570", f"S0 §4.5; {FA3} §4.2",
       "differs", ("06_flashattention3.ipynb", "GEMM-Softmax Pipelining, No Warp-Specialization"),
       ours="967 TFLOP/s (simulator, intra-warpgroup only)",
       note="the simulator keeps the producer warp, so it is not the paper's configuration"),
    _C("e4m3_max", "06_flashattention3",
       "The largest FP8 e4m3 value is 448.", "448", "448", "S1 §3.3", "reproduced",
       ("06_flashattention3.ipynb", "e4m3: 127 non-negative values, max 448"), shown="448"),
    _C("hadamard_cost", "06_flashattention3",
       "The random-sign Hadamard rotation costs O(d log d) per row.", "O(d log d)", None, f"S0 §4.6; {FA3} §3.3",
       "modelled", ("06_flashattention3.ipynb", "in $O(d \\log d)$ time")),
    _C("fp8_rmse_baseline", "06_flashattention3",
       "With outliers, per-tensor FP8 attention has an RMSE of 2.4e-2.", "2.4 × 10⁻²", "2.4e-2",
       f"S0 §4.6; {FA3} §4.3", "differs", ("06_flashattention3.ipynb", "We find per-tensor FP8 at about"),
       ours="1.4e-2 (NumPy emulation)", note="our outlier model and shapes differ from the paper's test"),
    _C("fp8_rmse_fa3", "06_flashattention3",
       "FA3's FP8 (block scales and rotation) has an RMSE of 9.1e-3.", "9.1 × 10⁻³", "9.1e-3",
       f"S0 §4.6; {FA3} §4.3", "differs", ("06_flashattention3.ipynb", "per_block_incoherent   RMSE mean 8.59e-03"),
       ours="8.59e-3 (NumPy emulation)", note="close, from a different test distribution"),
    _C("fp8_rmse_ratio", "06_flashattention3",
       "That is about 2.6 times lower error.", "约 2.6 分之一", "2.6", f"S0 §4.6, S1; {FA3} §4.3", "differs",
       ("06_flashattention3.ipynb", "(paper 2.6 ×, ours 1.7 ×)"), ours="1.7× (emulation and the H200 FP8 kernel)",
       note="the rotation does most of the work in our test; the paper's baseline error is larger"),
    _C("fa3_speedups", "06_flashattention3",
       "FA3's forward is 1.5–2.0 times and its backward 1.5–1.75 times faster than FA2.", "1.5–2.0 / 1.5–1.75 倍",
       "1.5..2.0", f"S0 §4.7, S1, S4; {FA3} §4.1", "quoted",
       ("06_flashattention3.ipynb", "1.5–2.0 times and its backward pass 1.5–1.75 times"),
       note="the book measures its own kernels, not FA3 against FA2"),
    _C("fa3_740", "06_flashattention3",
       "FA3 reaches 740 TFLOP/s in FP16.", "740 TFLOPS", "740", f"S0 §4.7, S1, S4; {FA3} abstract", "quoted",
       ("08_epilogue.ipynb", "740 TFLOP/s FP16, 75% utilisation")),
    _C("fa3_75pct", "06_flashattention3",
       "That is about 75 % of the H100's peak.", "约 75%", "75", f"S0 §4.7, S1, S4; {FA3} abstract",
       "reproduced", ("08_epilogue.ipynb", "740 (75%)"), shown="75", note="740 / 989.4 = 74.8 %"),
    _C("fa3_fp8_1200", "06_flashattention3",
       "In FP8, FA3 approaches 1.2 PFLOP/s.", "接近 1.2 PFLOPS", "1.2", f"S0 §4.7, S1; {FA3} abstract", "quoted",
       ("08_epilogue.ipynb", "≈1.2 PFLOP/s FP8")),
    _C("fa3_fp8_gain", "06_flashattention3",
       "FP8 is about 60 % faster than FA3's FP16 and about 3 times FA2's FP16.", "约 60%, 3 倍左右", "60", "S1 §5",
       "quoted", ("06_flashattention3.ipynb", "about 60 % more than FA3's own FP16"), note="1200 / 740 = 1.62"),
    _C("fa3_vs_cudnn", "06_flashattention3",
       "For sequences of 1K and longer FA3 beats NVIDIA's cuDNN on the H100.", "1k 及以上", "1024", f"S4; {FA3} §4.1",
       "quoted", ("06_flashattention3.ipynb", "from sequence length 1K upward it beat cuDNN"),
       note="the book also measures cuDNN against its own kernels (chapter 1 on an H200, chapter 5 on an H100)"),

    # ---------------------------------------------------------------- chapter 7
    _C("mma_rate", "07_flashattention4",
       "Per SM per cycle the tensor cores do 4096 16-bit FLOPs on the H100 and 8192 on the B200.", "4096 / 8192",
       "8192", f"S0 §5.1; {FA4}", "quoted", ("07_flashattention4.ipynb", "4096 → 8192 FLOPs per cycle per SM")),
    _C("mufu_rate", "07_flashattention4",
       "The exponential unit (MUFU) does 16 exponentials per SM per cycle on both.", "16 / 16", "16",
       f"S0 §5.1; {FA4}", "quoted", ("07_flashattention4.ipynb", "exponential unit (16 per cycle)")),
    _C("smem_rate", "07_flashattention4",
       "Shared memory delivers 128 bytes per SM per cycle on both.", "128 字节", "128", f"S0 §5.1; {FA4}",
       "quoted", ("07_flashattention4.ipynb", "shared-memory port (128 bytes per cycle)")),
    _C("tmem", "07_flashattention4",
       "The B200 adds 256 KB of tensor memory (TMEM) per SM.", "256 KB", "256", f"S0 §5.1, §5.5; {FA4}", "quoted",
       ("07_flashattention4.ipynb", "Each Blackwell SM has 256 KiB of TMEM")),
    _C("fwd_tile_h100", "07_flashattention4",
       "A 128×128×128 forward tile needs 2048 MMA cycles on the H100, and half as many exp cycles.", "2048",
       "2048", "S0 §5.2 (H100 derived from the paper's rates)", "reproduced",
       ("07_flashattention4.ipynb", "| H100 SXM5 | 2048 | 1024 | 0.50 |"), shown="2048"),
    _C("fwd_tile_b200", "07_flashattention4",
       "On the B200 the same tile needs 1024 MMA cycles and 1024 exp cycles.", "1024 / 1024", "1024",
       f"S0 §5.2; {FA4} Fig. 1", "reproduced",
       ("07_flashattention4.ipynb", "| B200 | 1024 | 1024 | 1.00 |"), shown="1024"),
    _C("bwd_mma", "07_flashattention4",
       "A backward tile needs 2560 MMA cycles on the B200.", "2560", "2560", f"S0 §5.2; {FA4}", "reproduced",
       ("07_flashattention4.ipynb", "B200 backward: MMA 2560"), shown="2560"),
    _C("bwd_smem", "07_flashattention4",
       "Its shared-memory traffic needs 3328 cycles.", "3328", "3328", f"S0 §5.2; {FA4}", "reproduced",
       ("07_flashattention4.ipynb", "SMEM 3328 cycles (+30% vs MMA)"), shown="3328",
       note="the per-operand table is the book's reconstruction; the paper gives only the totals"),
    _C("bwd_smem_30", "07_flashattention4",
       "That is 30 % more than the MMA cycles.", "多 30%", "30", "S0 §5.2", "reproduced",
       ("07_flashattention4.ipynb", "(+30% vs MMA)"), shown="30"),
    _C("bwd_2cta", "07_flashattention4",
       "With 2-CTA MMA the shared-memory cycles drop to 2688.", "2688", "2688", f"S0 §5.6; {FA4}", "reproduced",
       ("07_flashattention4.ipynb", "SMEM 2688 cycles (+5% vs MMA)"), shown="2688"),
    _C("bwd_2cta_5", "07_flashattention4",
       "That is only 5 % above the MMA cycles.", "多 5%", "5", "S0 §5.6", "reproduced",
       ("07_flashattention4.ipynb", "(+5% vs MMA)"), shown="5"),
    _C("cta_pair_m256", "07_flashattention4",
       "In 2-CTA mode two neighbouring SMs run one MMA with M = 256.", "M = 256", "256", f"S0 §5.6; {FA4}",
       "quoted", ("07_flashattention4.ipynb", "issue one MMA of 256 rows together")),
    _C("range_reduction", "07_flashattention4",
       "Range reduction splits x = n + f with 0 ≤ f < 1, e.g. −3.3 = −4 + 0.7.", "−3.3 = −4 + 0.7", None,
       "S0 §5.3", "reproduced", ("07_flashattention4.ipynb", "$-3.3 = -4 + 0.7$")),
    _C("cubic_horner", "07_flashattention4",
       "2^f on [0, 1) is a cubic evaluated with Horner's rule in 3 FMAs.", "三次多项式, 3 次乘加", "3", "S0 §5.3",
       "modelled", ("07_flashattention4.ipynb", "cubic Horner polynomial")),
    _C("poly_fraction", "07_flashattention4",
       "FA4 computes 10–25 % of each row's exponentials with the polynomial.", "10%–25%", "10..25",
       f"S0 §5.3; {FA4}", "modelled",
       ("07_flashattention4.ipynb", "computes 10–25 % of each row's exponentials with the polynomial"),
       note="the cycle model: the exp stage falls to 90 % of the MMA time at 10 %, 75 % at 25 %"),
    _C("exp_err_cubic", "07_flashattention4",
       "The cubic's maximum relative error in fp32 is 8.77e-5.", "8.77 × 10⁻⁵", "8.77e-5", f"S0 §5.3; {FA4}",
       "reproduced", ("07_flashattention4.ipynb", "cubic, FA4 coefficients"), shown="8.77e-05"),
    _C("exp_err_hw", "07_flashattention4",
       "The hardware exponential's maximum relative error is 1.41e-7.", "1.41 × 10⁻⁷", "1.41e-7",
       f"S0 §5.3; {FA4}", "differs", ("07_flashattention4.ipynb", "where the paper reports 1.41e-7"),
       ours="< 2e-7 (NumPy's exp2 in fp32)", note="the paper's number belongs to the GPU's ex2.approx, which a CPU does not have"),
    _C("exp_err_600x", "07_flashattention4",
       "So the cubic is about 600 times less accurate in fp32.", "约 600 倍", "600", "S0 §5.3", "quoted",
       ("07_flashattention4.ipynb", "about 600 times less accurate")),
    _C("exp_err_bf16_cubic", "07_flashattention4",
       "After rounding P to bf16 the cubic's maximum relative error is 3.90e-3.", "3.90 × 10⁻³", "3.90e-3",
       f"S0 §5.3; {FA4}", "reproduced", ("07_flashattention4.ipynb", "| cubic, FA4 coefficients | 8.77e-05 | 3.90e-03 |"),
       shown="3.90e-03"),
    _C("exp_err_bf16_hw", "07_flashattention4",
       "After the same rounding the hardware exponential's is 3.89e-3, bf16's own rounding error (about 3.9e-3).",
       "3.89 × 10⁻³", "3.89e-3", f"S0 §5.3; {FA4}", "reproduced",
       ("07_flashattention4.ipynb", "library np.exp2 (fp32)"), shown="3.89e-03"),
    _C("rescale_threshold", "07_flashattention4",
       "The reference maximum moves only when the new maximum exceeds it by more than 8 (log2), so intermediates stay below 2^8 = 256.",
       "超过 8 (2^8 = 256)", "8", f"S0 §5.4; {FA4}", "reproduced",
       ("07_flashattention4.ipynb", "| 8 | True | 5 | 155 |"), shown="8",
       note="largest intermediate printed: 155"),
    _C("rescale_9_to_1", "07_flashattention4",
       "In figure 10's row the true maximum changes 9 times but only 1 rescale is needed.", "9 次 → 1 次", "9",
       "S0 §5.4 (figure 10)", "reproduced",
       ("07_flashattention4.ipynb", "running max changes: 9   rescales with θ = 8: 1"), shown="9"),
    _C("tile_rows_128", "07_flashattention4",
       "The MMA tile grows from Hopper's 64 rows to 128, and each CTA handles two 128-row Q tiles.", "64 → 128 行",
       "128", f"S0 §5.5; {FA4}", "modelled",
       ("07_flashattention4.ipynb", "two Q tiles (ping-pong): 256 KiB of 256 KiB TMEM"),
       note="the book shows two 128-row tiles filling TMEM, and that one Hopper WGMMA covers 64 rows per warpgroup"),
    _C("deterministic_75", "07_flashattention4",
       "The deterministic backward runs at up to 75 % of the non-deterministic speed.", "75%", "75",
       f"S0 §5.6; {FA4}", "quoted", ("07_flashattention4.ipynb", "runs at up to 75 % of the speed")),
    _C("compile_times", "07_flashattention4",
       "CuTe-DSL cuts compile time from 55 s to 2.5 s (forward) and 45 s to 1.4 s (backward), 20–30 times.",
       "55→2.5 s, 45→1.4 s, 20–30 倍", "20..30", f"S0 §5.7; {FA4}", "quoted",
       ("07_flashattention4.ipynb", "drops from 55 s to 2.5 s")),
    _C("fa4_1613", "07_flashattention4",
       "FA4 reaches 1613 TFLOP/s in BF16 on the B200.", "1613 TFLOPS", "1613", f"S0 §5.8; {FA4} abstract", "quoted",
       ("07_flashattention4.ipynb", "1613 / 2250 = 71.7%")),
    _C("fa4_71pct", "07_flashattention4",
       "That is 71 % of the B200's peak.", "71%", "71", f"S0 §5.8; {FA4} abstract", "differs",
       ("07_flashattention4.ipynb", "which the paper truncates to 71 %"), ours="71.7 % (the epilogue table prints 72 %)",
       note="1613 / 2250 TFLOP/s; the paper truncates"),
    _C("fa4_vs_cudnn_triton", "07_flashattention4",
       "FA4 is 1.1–1.3 times faster than cuDNN 9.13 and 2.1–2.7 times faster than Triton.", "1.1–1.3 / 2.1–2.7 倍",
       "1.1..1.3", f"S0 §5.8; {FA4}", "quoted", ("07_flashattention4.ipynb", "1.1–1.3× faster than NVIDIA's cuDNN 9.13")),
    _C("b300_mufu", "07_flashattention4",
       "The B300 doubles the exponential unit to 32 per SM per cycle.", "32 次", "32", f"S0 §5.8; {FA4}", "quoted",
       ("07_flashattention4.ipynb", "the B300 doubles the MUFU to 32 exponentials per SM per cycle")),
    _C("dq_atomics_half", "07_flashattention4",
       "Reordering the dQ computation halves each CTA's global atomic adds.", "减半", "0.5", f"S0 §5.6; {FA4}",
       "quoted", ("07_flashattention4.ipynb", "half as many atomic adds to global memory (FlashAttention-4 paper")),
]


def _anchor_md(nb: str, anchor: str) -> str:
    stem = nb.removesuffix(".ipynb")
    text = anchor.replace("`", "'")
    return f"{{doc}}`{stem[:2]} <notebooks/{stem}>` · `{text}`".replace("|", "\\|")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(claims: list[Claim] = CLAIMS) -> str:
    """The Markdown of the appendix page."""
    counts = {s: sum(c.status == s for c in claims) for s in STATUSES}
    lines = [
        "# Appendix: every number in the seed documents",
        "",
        "<!-- Generated by `python -m flashlab.course.claims book/seed_numbers.md` from flashlab/claims.py; do not edit. -->",
        "",
        "This book was written from four Chinese source documents (its *seeds*). Each row",
        "below is one number they state, the status it has in the book, and where to find it.",
        "",
        "- **reproduced**: a notebook computes the number and prints it; the tests check that the",
        "  printed value still matches the seed to the seed's precision;",
        "- **modelled**: a model in the book (the IO simulator, the event simulator, the cycle",
        "  model, a proof) explains it;",
        "- **quoted**: the book quotes it, labelled as a quotation;",
        "- **differs**: the book computed or measured something else; the last column says what and why;",
        "- **not covered**: the book does not mention it yet.",
        "",
        "The *where* column links the chapter and gives a phrase to search for on its page.",
        "",
        "Totals: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES) + f" ({len(claims)} numbers).",
        "",
        "Seeds: " + "; ".join(f"**{k}** {v}" for k, v in SEEDS.items()) + ".",
        "",
    ]
    for stem, title in CHAPTERS.items():
        rows = [c for c in claims if c.chapter == stem]
        if not rows:
            continue
        lines += [f"## {title}", "", "| claim | seed | status | where | ours / notes |", "|---|---|---|---|---|"]
        for c in rows:
            where = _anchor_md(*c.where) if c.where else ""
            notes = "; ".join(x for x in (f"ours: {c.ours}" if c.ours else "", c.note) if x)
            notes = f"{notes} ({c.source})" if notes else f"({c.source})"
            lines.append(f"| {_cell(c.claim)} | {_cell(c.seed)} | {c.status} | {where} | {_cell(notes)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m flashlab.course.claims OUT.md", file=sys.stderr)
        return 2
    Path(argv[0]).write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
