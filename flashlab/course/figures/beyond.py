"""Chapter 9 figures: which tiles of the score matrix a kernel computes, masks or skips
under a causal mask (square and N_q < N_k, both bottom-right aligned) and a sliding
window (:func:`block_masks`); and the chapter's features measured on the H200, each
beside its baseline (:func:`features_h200`: causal, windows, GQA and varlen from
``results/beyond_h200``, decoding from ``results/decode_h200``).

In :func:`block_masks` everything drawn comes from :func:`flashlab.reference.beyond.window_mask` (the mask)
and :func:`flashlab.reference.beyond.window_block_counts` (the tile counts in the
titles). A tile is *skipped* when the mask is False everywhere in it, *masked* (a
diagonal tile) when it is partly True, and *full* when it is True everywhere: the same
classification as ``window_block_counts``. Colours are the Okabe-Ito palette of
:mod:`.timeline`.

The chapter's tables read the same two runs through the small helpers below
(:func:`recorded_ms`, :func:`decode_shapes`, :func:`decode_timing`,
:func:`decode_splits`), so the figure and the printed numbers come from one place.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from flashlab.hardware import H200
from flashlab.reference.beyond import window_block_counts, window_mask
from flashlab.course.figures.timeline import COLOURS

__all__ = ["block_masks", "features_h200", "recorded_ms", "decode_shapes", "decode_timing",
           "decode_splits"]

TILE_COLOURS = {"full": COLOURS[0], "masked": COLOURS[1], "skipped": "0.93"}


def _panel(ax, n_q: int, n_k: int, block: int, window: tuple[int, int], title: str) -> None:
    """One score matrix: the mask in light shading, each tile outlined in its class colour."""
    mask = window_mask(n_q, n_k, window)  # (n_q, n_k), True = query i sees key j
    ax.imshow(mask, cmap=ListedColormap(["white", "#BBD7EA"]), extent=(0, n_k, n_q, 0), interpolation="nearest")
    for r0 in range(0, n_q, block):
        for c0 in range(0, n_k, block):
            tile = mask[r0:r0 + block, c0:c0 + block]
            kind = "full" if tile.all() else "masked" if tile.any() else "skipped"
            fill = kind == "skipped"
            ax.add_patch(Rectangle((c0, r0), block, block, fill=fill, fc=TILE_COLOURS["skipped"], ec=TILE_COLOURS[kind],
                                   lw=0.6 if fill else 2.0, zorder={"skipped": 1, "full": 2, "masked": 3}[kind]))
    c = window_block_counts(n_q, n_k, block, block, window)
    ax.set_title(f"{title}\ncomputed {c['computed']} of {c['total']} tiles "
                 f"({c['diagonal']} masked), skipped {c['skipped']}", fontsize=10, loc="left")
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    ax.set_xlim(0, n_k)
    ax.set_ylim(n_q, 0)
    ax.set_aspect("equal")


def block_masks(n: int = 512, block: int = 64, left: int = 128) -> Figure:
    """Three score matrices cut into ``block`` x ``block`` tiles.

    (a) causal, N_q = N_k = n; (b) causal, N_q = n / 2 new queries against N_k = n keys,
    bottom-right aligned (query i sees key j iff j <= i + N_k - N_q); (c) causal sliding
    window of ``left`` keys to the left, N_q = N_k = n. Shaded cells are the (i, j) the
    mask allows; blue tiles are computed without a mask, vermilion tiles with the mask,
    grey tiles are never loaded.
    """
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 5.2), layout="constrained",
                             gridspec_kw={"width_ratios": [1, 1, 1]})
    _panel(axes[0], n, n, block, (-1, 0), f"(a) causal, $N_q = N_k = {n}$")
    _panel(axes[1], n // 2, n, block, (-1, 0), f"(b) causal, $N_q = {n // 2}$, $N_k = {n}$ (bottom-right)")
    _panel(axes[2], n, n, block, (left, 0), f"(c) sliding window, {left} keys back")
    handles = [Patch(fc="white", ec=TILE_COLOURS["full"], lw=2, label="computed, no mask"),
               Patch(fc="white", ec=TILE_COLOURS["masked"], lw=2, label="computed with the mask (diagonal tile)"),
               Patch(fc=TILE_COLOURS["skipped"], ec="0.6", label="skipped: K_j, V_j never loaded"),
               Patch(fc="#BBD7EA", ec="none", label="allowed (i, j)")]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=9.5, frameon=False)
    fig.suptitle(f"Tiles of {block} x {block} scores: the mask decides which tiles a kernel visits",
                 fontsize=12)
    return fig


# Okabe-Ito colours beyond the four of .timeline
ORANGE, SKY, YELLOW, GREY = "#E69F00", "#56B4E9", "#F0E442", "0.55"


# --------------------------------------------------------------------------- reading the runs
def recorded_ms(rec, case: str, pass_: str = "fwd", **where: object) -> float:
    """The time (ms) of the one row of ``rec`` with this ``case``, pass (``"fwd"`` or
    ``"fwdbwd"``) and column values, e.g. ``recorded_ms(feat, "causal", "fwd", causal=True)``."""
    rows = rec.where(case=case, **{"pass": pass_}, **where)
    if len(rows) != 1:
        raise ValueError(f"case={case!r}, pass={pass_!r} and {where} must pick exactly one row of "
                         f"results/{rec.stem}; they pick {len(rows)}")
    return rows[0]["ms"]


def decode_shapes(rec) -> list[tuple[int, int, int, int]]:
    """The decoding shapes (B, H, N, d) of a run, in the order they were measured."""
    return list(dict.fromkeys((r["B"], r["H"], r["N"], r["d"]) for r in rec.where(case="decode")))


def decode_timing(rec, impl: str, B: int, H: int, N: int) -> dict[str, float]:
    """One implementation at one decoding shape of ``results/decode_h200``: ``ms`` per call
    from Python (do_bench), ``graph_ms`` the GPU time alone (the call replayed in a CUDA
    graph), ``host_us`` the host's microseconds per call, and ``tb_s`` the cache bytes
    (K and V, bf16, read once) divided by the GPU time, in TB/s."""
    (eager,) = rec.where(case="decode", impl=impl, B=B, H=H, N=N)
    (graph,) = rec.where(case="decode", impl=impl + "_graph", B=B, H=H, N=N)
    cache_bytes = 2 * B * H * N * eager["d"] * 2
    return {"ms": eager["ms"], "graph_ms": graph["ms"], "host_us": eager["host_us"],
            "tb_s": cache_bytes / (graph["ms"] * 1e-3) / 1e12}


def decode_splits(rec, B: int, H: int, N: int) -> tuple[int, dict[int, float]]:
    """The split-count sweep at one decoding shape: (the count ``choose_num_splits`` chose,
    {number of splits: GPU time in ms, from a CUDA graph})."""
    rows = [r for r in rec.where(case="decode", B=B, H=H, N=N) if r["num_splits"] != ""]
    if not rows:
        raise ValueError(f"results/{rec.stem} has no split-count sweep at B={B}, H={H}, N={N}")
    times = {int(r["num_splits"]): r["ms"] for r in rows}
    return int(rows[0]["chosen_splits"]), dict(sorted(times.items()))


def _ratio_label(base_ms: float, t_ms: float) -> str:
    """The time and how it compares with the baseline's: 'x.xx× faster', 'x.xx× slower', or
    'same time' within 2 %."""
    if t_ms == base_ms:
        return f"{t_ms:.2f} ms\nbaseline"
    r = base_ms / t_ms
    if abs(r - 1) < 0.02:
        return f"{t_ms:.2f} ms\nsame time"
    return f"{t_ms:.2f} ms\n{r:.2f}× faster" if r > 1 else f"{t_ms:.2f} ms\n{1 / r:.2f}× slower"


def _relative_panel(ax, rec, bars: list[tuple[str, dict, str]], title: str, ylabel: str) -> None:
    """Grouped bars, one group per pass (forward, forward + backward): each bar's time divided by
    the first bar's (the baseline), with the time and the ratio written on it.
    ``bars`` = (label, row filter including the case, colour); a bar with no row in a pass is left out."""
    width = 0.8 / len(bars)
    for k, (label, where, colour) in enumerate(bars):
        xs, ys, texts = [], [], []
        for x, pas in enumerate(("fwd", "fwdbwd")):
            rows = rec.where(**where, **{"pass": pas})
            if not rows:
                continue
            base = rec.where(**bars[0][1], **{"pass": pas})[0]["ms"]
            xs.append(x + (k - (len(bars) - 1) / 2) * width)
            ys.append(rows[0]["ms"] / base)
            texts.append(_ratio_label(base, rows[0]["ms"]))
        ax.bar_label(ax.bar(xs, ys, width * 0.92, color=colour, label=label), texts, fontsize=6.3, padding=2)
    ax.set_xticks([0, 1], ["forward", "forward + backward"])
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)
    ax.axhline(1.0, color=GREY, lw=0.8, ls=":")
    ax.set_title(title, loc="left", fontsize=9.5)
    ax.legend(frameon=False, fontsize=7, loc="upper right")
    ax.spines[["top", "right"]].set_visible(False)


def features_h200(stem: str = "beyond_h200", decode_stem: str = "decode_h200") -> Figure:
    """The chapter's features measured on the H200, each beside its baseline, bf16, d = 128.

    From ``results/beyond_h200`` (one run, each kernel with its first configuration, no
    autotuning): (a) causal vs full attention, N = 16384; (b) causal + sliding window (4096
    and 1024 keys back) vs plain causal, N = 16384; (c) GQA/MQA: 32 query heads with 32, 8
    or 1 K/V heads, N = 8192; (d) a packed varlen batch vs the same kernel on the padded
    batch vs SDPA with a padding mask (forward only). Bars are times divided by the
    baseline's (first bar), with the time and the ratio written on each.

    From ``results/decode_h200``: (e) decoding, one new token against a KV cache at four
    shapes: bars are the achieved bandwidth on the GPU alone (cache bytes / time of the call
    replayed in a CUDA graph), dots the bandwidth per call from Python (host time included);
    the H200's HBM bandwidth is dashed. Under each group: the split kernel's speed relative
    to SDPA flash's, per call and on the GPU alone.
    """
    from flashlab.lab.results import load

    rec, dec = load(stem), load(decode_stem)
    fig = plt.figure(figsize=(13.5, 8.8), layout="constrained")
    grid = fig.add_gridspec(2, 3, width_ratios=[1, 1, 1.2])
    ax_c, ax_w, ax_g = (fig.add_subplot(grid[0, i]) for i in range(3))
    ax_v, ax_d = fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1:])

    causal = {"case": "causal", "causal": True}
    _relative_panel(ax_c, rec, [("full (non-causal)", {"case": "causal", "causal": False}, GREY),
                                ("causal", causal, COLOURS[0])],
                    "(a) causal block skipping, N = 16384", "time / full attention's time")
    _relative_panel(ax_w, rec, [("causal, no window", causal, COLOURS[0]),
                                ("causal, window 4096", {"case": "window", "window": 4096}, ORANGE),
                                ("causal, window 1024", {"case": "window", "window": 1024}, COLOURS[1])],
                    "(b) sliding window, N = 16384", "time / causal time")
    _relative_panel(ax_g, rec, [("32 K/V heads (MHA)", {"case": "gqa", "h_kv": 32}, COLOURS[0]),
                                ("8 K/V heads (GQA)", {"case": "gqa", "h_kv": 8}, COLOURS[2]),
                                ("1 K/V head (MQA)", {"case": "gqa", "h_kv": 1}, COLOURS[3])],
                    "(c) 32 query heads sharing K/V heads, causal, N = 8192", "time / MHA time")
    _relative_panel(ax_v, rec, [("padded to 4096 (same kernel)", {"case": "varlen", "impl": "flashlab_padded"}, GREY),
                                ("packed (varlen kernel)", {"case": "varlen", "impl": "flashlab_varlen"}, COLOURS[2]),
                                ("SDPA + padding mask (forward only)", {"case": "varlen", "impl": "sdpa_padded_mask"}, COLOURS[3])],
                    "(d) 16 sequences of 1..4096 tokens, causal", "time / padded time")

    impls = [("flashlab_decode_unsplit", "flashlab, 1 split", SKY),
             ("flashlab_decode_split", "flashlab split-KV (merge inside, default)", COLOURS[0]),
             ("flashlab_decode_split_separate", "flashlab split-KV + separate combine kernel", COLOURS[2]),
             ("flashlab_decode_paged16", "flashlab split-KV, paged (16-key pages)", YELLOW),
             ("sdpa_flash", "SDPA flash", ORANGE), ("sdpa_cudnn", "SDPA cuDNN", COLOURS[1])]
    shapes = decode_shapes(dec)
    width = 0.8 / len(impls)
    for k, (impl, label, colour) in enumerate(impls):
        xs, gpu, call = [], [], []
        for x, (B, H, N, _) in enumerate(shapes):
            t = decode_timing(dec, impl, B, H, N)
            xs.append(x + (k - (len(impls) - 1) / 2) * width)
            gpu.append(t["tb_s"])
            call.append(t["tb_s"] * t["graph_ms"] / t["ms"])  # the same bytes over the time per call
        ax_d.bar(xs, gpu, width * 0.92, color=colour, label=label)
        ax_d.plot(xs, call, "o", ms=3.5, color="black", label="per call from Python (host included)" if k == 0 else None)
    ax_d.axhline(H200.hbm_bandwidth / 1e12, color="black", lw=1, ls="--")
    ax_d.text(len(shapes) - 0.55, H200.hbm_bandwidth / 1e12 + 0.08, f"H200 HBM {H200.hbm_bandwidth / 1e12:.1f} TB/s",
              ha="right", fontsize=7.5)
    ticks = []
    for B, H, N, _ in shapes:
        split, flash = (decode_timing(dec, i, B, H, N) for i in ("flashlab_decode_split", "sdpa_flash"))
        ticks.append(f"B = {B}, H = {H}, N = {N}\nsplit-KV: {split['ms']:.3f} ms per call\n× SDPA flash's speed:\n"
                     f"{flash['ms'] / split['ms']:.2f} per call, {flash['graph_ms'] / split['graph_ms']:.2f} on GPU")
    ax_d.set_xticks(range(len(shapes)), ticks, fontsize=7.5)
    ax_d.set_ylabel("achieved bandwidth, TB/s (cache bytes / time)")
    ax_d.set_ylim(0, 6.5)
    ax_d.set_title("(e) decoding, one new token against a KV cache (H_kv = H); bars: GPU time alone (CUDA graph)",
                   loc="left", fontsize=9.5)
    ax_d.legend(frameon=False, fontsize=7, ncol=3, loc="upper left")
    ax_d.spines[["top", "right"]].set_visible(False)

    fig.suptitle("Chapter 9's features on the H200, bf16, d = 128: each beside its baseline", fontsize=12)
    fig.supxlabel(f"(a)–(d): {rec.short}, each kernel's first configuration (no autotuning).   (e): {dec.short}.",
                  fontsize=7, color="0.35")
    return fig
