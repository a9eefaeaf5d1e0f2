"""Notebook 03's figures: the strategies side by side, kvlab beside transformers, offloading under load.

``frame`` is ``run_strategies``' table (one row per setting and context); ``accuracy`` is ``accuracy_by_distance``'s (or
``recall_accuracy`` frames concatenated): one row per setting and distance bucket. Each function draws on ``ax`` when
given (and returns its Figure) or makes its own Figure; ``plot_strategies`` puts them all on one page.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal, cast

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from kvlab.experiments.offload_load import OFFLOADED, ON_DEVICE, OffloadUnderLoad, paired_steps, spread_stats
from kvlab.lessons.common.figure_style import cache_color

if TYPE_CHECKING:  # matplotlib.typing grows by version: LegendLocType is 3.11's, Colab has 3.10
    from matplotlib.typing import LegendLocType

EXACT = "dynamic"
_QUANT_SHADE = {8: 0.45, 4: 0.7, 2: 0.95}  # darker purple = fewer bits
_MARKERS = ["o", "s", "^", "D", "v", "P", "X"]


def _axes(ax: Axes | None, size: tuple[float, float] = (6.5, 4.2)) -> Axes:
    return ax if ax is not None else Figure(figsize=size, layout="constrained").subplots()


def _finish(ax: Axes, legend: bool, loc: LegendLocType = "upper left", grid: Literal["both", "x", "y"] = "both",
            **labels) -> Figure:
    """How every panel here ends: its title and axis labels, a light grid and (if asked) the legend."""
    ax.set(**labels)
    ax.grid(alpha=0.3, axis=grid)
    if legend:
        ax.legend(fontsize=7, loc=loc)
    return cast(Figure, ax.figure)  # the axes here are a Figure's, never a SubFigure's


def _nothing(ax: Axes, text: str, title: str = "") -> Figure:
    """A panel with nothing to draw: ``text`` in its middle, under ``title``."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="#555")
    ax.set(title=title)
    return cast(Figure, ax.figure)


def _bits_of(setting: str, default: float = np.nan) -> float:
    m = re.search(r"bits=(\d+)", setting)
    return float(m.group(1)) if m else default


def setting_style(setting: str, strategy: str | None = None) -> dict:
    """Colour, marker and line style of one setting: the strategy's colour; quantized darker as bits fall."""
    strategy = strategy or setting.split("(")[0]
    if strategy == "offloaded" and "link_gbps=" in setting:  # the same tier behind a slow link
        return dict(color=cache_color(strategy), marker="s", ls="--")
    if strategy != "quantized":
        return dict(color=cache_color(strategy), marker="o", ls="-")
    from matplotlib import colormaps

    opts = _options_of(setting)
    bits = int(opts.get("bits", 4))
    variant = (opts.get("group_size", "32") != "32") + 2 * (opts.get("residual", "64") != "0")  # defaults: 32, 64
    return dict(color=colormaps["Purples"](_QUANT_SHADE.get(bits, 0.6)), marker=_MARKERS[variant % len(_MARKERS)],
                ls=["-", "--", ":", "-."][variant % 4])


def _options_of(setting: str) -> dict[str, str]:
    """``quantized(bits=4, residual=32)`` -> {"bits": "4", "residual": "32"}."""
    return dict(re.findall(r"(\w+)=([\w.]+)", setting))


def _family(setting: str) -> str:
    """The setting without its bits: the settings of one line of accuracy vs bits."""
    opts = {k: v for k, v in _options_of(setting).items() if k != "bits"}
    name = setting.split("(")[0]
    return f"{name}({', '.join(f'{k}={v}' for k, v in opts.items())})" if opts else name


def _bytes_per_token(frame: pd.DataFrame, bytes_per_token: int | None) -> int | None:
    return bytes_per_token if bytes_per_token is not None else frame.attrs.get("bytes_per_token")


def _label_of(setting: str) -> str:
    return setting.replace("quantized", "quant").replace("residual", "res").replace("group_size", "group")


def plot_memory_vs_context(frame: pd.DataFrame, bytes_per_token: int | None = None, ax: Axes | None = None,
                           legend: bool = True) -> Figure:
    """KiB allocated by each setting vs tokens stored, over the formula (black dashed) and, for each
    quantized setting, its ideal size (dotted: bits / element bits + a scale and zero-point per group).

    ``bytes_per_token`` (2 x layers x kv_heads x head_dim x bytes) draws the formula; default
    ``frame.attrs["bytes_per_token"]``; without either the formula lines are left out.
    """
    ax = _axes(ax)
    bpt = _bytes_per_token(frame, bytes_per_token)
    tokens = np.sort(frame["stored_tokens"].unique())
    if bpt:
        ax.plot(tokens, tokens * bpt / 1024, color="black", ls="--", lw=2.2, zorder=3,
                label="formula: 2 × layers × kv_heads × head_dim × tokens × 4 B")
    for setting, rows in frame.groupby("setting", sort=False):
        rows = rows.sort_values("stored_tokens")
        st = setting_style(setting, rows["strategy"].iloc[0])
        ax.plot(rows["stored_tokens"], rows["allocated_bytes"] / 1024, color=st["color"], marker=st["marker"],
                ls=st["ls"], lw=1.6, ms=5, label=_label_of(setting))
        if bpt and rows["strategy"].iloc[0] == "quantized":
            ideal = rows["stored_tokens"] * bpt * rows["ideal_memory_ratio"] / 1024
            ax.plot(rows["stored_tokens"], ideal, color=st["color"], ls=":", lw=1, alpha=0.9)
    static = frame[frame["strategy"] == "static"]
    if len(static):
        first = static.sort_values("stored_tokens").iloc[0]
        if first["reserved_bytes"] > 0:
            ax.annotate(f"static: {first['reserved_bytes'] / 1024:,.0f} KiB reserved, empty",
                        (first["stored_tokens"], first["allocated_bytes"] / 1024), textcoords="offset points",
                        xytext=(4, -14), fontsize=7, color=cache_color("static"))
    ax.set_ylim(bottom=0)
    return _finish(ax, legend, title="Memory vs context", xlabel="tokens in the cache", ylabel="KiB allocated")


def plot_latency_vs_context(frame: pd.DataFrame, ax: Axes | None = None, legend: bool = True) -> Figure:
    """Per-token decode latency vs prompt length: the median (p50) with a whisker up to the p95."""
    ax = _axes(ax)
    settings = list(dict.fromkeys(frame["setting"]))
    width = 0.012 * (frame["context_tokens"].max() - frame["context_tokens"].min() or 100)
    for i, setting in enumerate(settings):
        rows = frame[frame["setting"] == setting].sort_values("context_tokens")
        st = setting_style(setting, rows["strategy"].iloc[0])
        x = rows["context_tokens"] + (i - (len(settings) - 1) / 2) * width  # side by side, not on top
        p50, p95 = rows["token_ms_p50"].to_numpy(), rows["token_ms_p95"].to_numpy()
        ax.errorbar(x, p50, yerr=[np.zeros_like(p50), p95 - p50], color=st["color"], marker=st["marker"],
                    ls=st["ls"], lw=1.4, ms=5, capsize=3, elinewidth=0.8, label=_label_of(setting))
    ax.set_ylim(bottom=0)
    return _finish(ax, legend, title="Time per token vs context (p50, whisker to p95)", xlabel="prompt tokens",
                   ylabel="ms per decode step")


def plot_cache_time(frame: pd.DataFrame, ax: Axes | None = None, legend: bool = True) -> Figure:
    """ms per decode step spent inside the cache's ``update``: quantizing + dequantizing, copying between
    tiers, writing in place. Beside it (grey) the median step time of the exact cache, for scale."""
    ax = _axes(ax)
    measured = frame.dropna(subset=["cache_ms_per_step"])
    for setting, rows in measured.groupby("setting", sort=False):
        rows = rows.sort_values("context_tokens")
        st = setting_style(setting, rows["strategy"].iloc[0])
        ax.plot(rows["context_tokens"], rows["cache_ms_per_step"], color=st["color"], marker=st["marker"],
                ls=st["ls"], lw=1.4, ms=5, label=_label_of(setting))
    exact = frame[frame["setting"] == EXACT].sort_values("context_tokens")
    if len(exact):
        ax.plot(exact["context_tokens"], exact["token_ms_p50"], color="#999", lw=6, alpha=0.35,
                label="a whole dynamic step (p50)", zorder=0)
    if not len(measured):
        _nothing(ax, "not measured in this run\n(no cache_ms_per_step column values)")
    ax.set_ylim(bottom=0)
    return _finish(ax, legend, title="Time inside the cache per step", xlabel="prompt tokens",
                   ylabel="ms per step in update()")


def expected_bytes_moved(context_tokens: int, stored_tokens: int, bytes_per_token: int) -> float:
    """Mean bytes an offloaded cache moves per decode step: each step reads every stored token of every
    layer and writes the new one; over the steps the stored count runs from context to stored_tokens - 1."""
    return (context_tokens + stored_tokens + 1) / 2 * bytes_per_token


def plot_bytes_moved(frame: pd.DataFrame, bytes_per_token: int | None = None, ax: Axes | None = None,
                     legend: bool = True) -> Figure:
    """Offloaded: KiB moved between the tiers per decode step vs context (bars: measured; black: expected
    from the token count), each labelled with the latency it adds over the dynamic cache (p50)."""
    ax = _axes(ax)
    off = frame[frame["strategy"] == "offloaded"].sort_values("context_tokens")
    if not len(off):
        return _nothing(ax, "no offloaded setting in this run", "Bytes moved per step (offloaded)")
    bpt = _bytes_per_token(frame, bytes_per_token)
    x = np.arange(len(off))
    for j, (setting, rows) in enumerate(off.groupby("setting", sort=False)):
        n = off["setting"].nunique()
        pos = x[:len(rows)] + (j - (n - 1) / 2) * 0.8 / n
        bars = ax.bar(pos, rows["bytes_moved_per_step"] / 1024, width=0.8 / n, color=cache_color("offloaded"),
                      alpha=0.55 + 0.45 * (j == 0), label=f"{_label_of(setting)}: measured")
        dyn = frame[frame["setting"] == EXACT].set_index("context_tokens")["token_ms_p50"]
        for bar, r in zip(bars, rows.itertuples()):
            if r.context_tokens in dyn.index:
                added = r.token_ms_p50 - dyn[r.context_tokens]
                ax.annotate(f"{added:+.2f} ms", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    ctx = off.drop_duplicates("context_tokens")
    if bpt:
        expected = [expected_bytes_moved(c, s, bpt) / 1024 for c, s in zip(ctx["context_tokens"], ctx["stored_tokens"])]
        ax.scatter(x[:len(ctx)], expected, marker="_", s=900, color="black", zorder=3,
                   label="expected: (stored + 1 new) tokens × bytes per token")
    ax.set_xticks(x[:len(ctx)], [f"{c}" for c in ctx["context_tokens"]])
    ax.margins(y=0.15)
    return _finish(ax, legend, grid="y", title="Offloaded: bytes moved per step (label: ms added vs dynamic)",
                   xlabel="prompt tokens", ylabel="KiB per decode step")


def plot_offload_cost(frame: pd.DataFrame, ax: Axes | None = None, legend: bool = True) -> Figure:
    """Offloaded: the median time of a decode step against the bytes it moves, one line per offloaded
    setting (its points are the contexts, labelled in prompt tokens). Grey: the dynamic cache's step
    at the same contexts, which moves nothing; dotted, for each slow link: that step plus the time
    the link needs for the bytes (bytes / rate), the least a step over that link can take.
    The legend gives the bytes moved per second of copying each setting achieved."""
    ax = _axes(ax)
    off = frame[frame["strategy"] == "offloaded"]
    if not len(off):
        return _nothing(ax, "no offloaded setting in this run", "Offloaded: step time vs bytes moved")
    dyn = frame[frame["setting"] == EXACT].set_index("context_tokens")["token_ms_p50"]
    first = off[off["setting"] == off["setting"].iloc[0]].sort_values("context_tokens")
    if len(dyn):
        kib = first["bytes_moved_per_step"] / 1024
        ax.plot(kib, first["context_tokens"].map(dyn), color="#999", lw=5, alpha=0.4, marker="o",
                label="dynamic at the same contexts (moves nothing)", zorder=0)
    for setting, rows in off.groupby("setting", sort=False):
        rows = rows.sort_values("context_tokens")
        st = setting_style(setting, "offloaded")
        kib = rows["bytes_moved_per_step"] / 1024
        rate = rows["copy_gb_per_s"].median() if "copy_gb_per_s" in rows else np.nan
        label = _label_of(setting) + (f": copies at {rate:.2f} GB/s" if rate == rate else "")
        ax.plot(kib, rows["token_ms_p50"], color=st["color"], marker=st["marker"], ls=st["ls"], lw=1.6, ms=6,
                label=label)
        link = rows["link_gbps"].iloc[0] if "link_gbps" in rows else np.nan
        if link == link and len(dyn):
            floor = rows["context_tokens"].map(dyn) + rows["link_ms_per_step"]
            ax.plot(kib, floor, color=st["color"], ls=":", lw=1.2,
                    label=f"dynamic + bytes / {link:g} GB/s (the link's own time)")
    for r in first.itertuples():
        ax.annotate(f"{r.context_tokens} tok", (r.bytes_moved_per_step / 1024, dyn.get(r.context_tokens, np.nan)),
                    textcoords="offset points", xytext=(0, -12), ha="center", fontsize=7, color="#555")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    return _finish(ax, legend, title="Offloaded: step time vs bytes moved (p50)", xlabel="KiB moved per decode step",
                   ylabel="ms per decode step")


def _summary(accuracy: pd.DataFrame) -> pd.DataFrame:
    """Overall accuracy per setting (correct answers over all questions), with its bits."""
    rows = []
    for setting, g in accuracy.groupby("setting", sort=False):
        n = g["examples"].sum()
        bits = g["bits"].iloc[0] if "bits" in g else _bits_of(setting, 32.0)
        rows.append(dict(setting=setting, strategy=g["strategy"].iloc[0] if "strategy" in g else setting.split("(")[0],
                         bits=float(bits), accuracy=float((g["accuracy"].fillna(0) * g["examples"]).sum() / n),
                         exact_accuracy=float((g["exact_accuracy"].fillna(0) * g["examples"]).sum() / n),
                         family=_family(setting)))
    return pd.DataFrame(rows)


def plot_accuracy_vs_bits(accuracy: pd.DataFrame, ax: Axes | None = None, legend: bool = True) -> Figure:
    """Recall accuracy of each quantized setting vs its bits (one line per group size / residual window),
    with the exact cache's accuracy on the same questions as a dashed line."""
    ax = _axes(ax)
    s = _summary(accuracy)
    exact = float(s["exact_accuracy"].iloc[0]) if len(s) else np.nan
    ax.axhline(exact, color="black", ls="--", lw=1.5, label=f"exact cache: {exact:.0%}", zorder=1)
    quant = s[s["strategy"] == "quantized"]
    for family, rows in quant.groupby("family", sort=False):
        rows = rows.sort_values("bits")
        st = setting_style(rows["setting"].iloc[0], "quantized")
        ax.plot(rows["bits"], rows["accuracy"], color=cache_color("quantized"), marker=st["marker"], ls=st["ls"],
                lw=1.6, ms=6, label=_label_of(family))
        for r in rows.itertuples():
            ax.annotate(f"{r.accuracy:.0%}", (r.bits, r.accuracy), textcoords="offset points", xytext=(5, -10),
                        fontsize=7)
    ax.set_xscale("log", base=2)
    ticks = sorted(set(quant["bits"].astype(int)) | {2, 4, 8})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.invert_xaxis()  # precision falls to the right
    ax.set_ylim(-0.03, 1.05)
    pairs = accuracy["pairs"].iloc[0] if "pairs" in accuracy else None
    n = int(accuracy.groupby("setting", sort=False)["examples"].sum().iloc[0]) if len(accuracy) else 0
    ax.yaxis.set_major_formatter(lambda y, _p: f"{y:.0%}")
    return _finish(ax, legend, "best", title=f"Recall accuracy vs bits ({n} questions"
                   + (f", {pairs} pairs)" if pairs else ")"),
                   xlabel="bits per stored key/value element", ylabel="exact answers")


def plot_accuracy_by_distance(accuracy: pd.DataFrame, ax: Axes | None = None, legend: bool = True) -> Figure:
    """Recall accuracy per distance bucket (tokens between the fact and the query), one line per setting;
    the exact cache dashed black. Each tick names its bucket's number of questions (n)."""
    ax = _axes(ax)
    acc = accuracy.copy()
    if "distance_mid" not in acc:
        acc["distance_mid"] = [iv.mid for iv in acc["distance_bucket"]]
    for setting, rows in acc.groupby("setting", sort=False):
        exact = setting == EXACT
        st = setting_style(setting, rows["strategy"].iloc[0] if "strategy" in rows else None)
        ax.plot(rows["distance_mid"], rows["accuracy"], color="black" if exact else st["color"],
                ls="--" if exact else st["ls"], marker="" if exact else st["marker"], lw=1.8 if exact else 1.4, ms=5,
                label="exact cache" if exact else _label_of(setting), zorder=4 if exact else 2)
    if EXACT not in set(acc["setting"]):  # recall_accuracy frames carry the exact accuracy beside each row
        ref = acc.drop_duplicates("distance_mid")
        ax.plot(ref["distance_mid"], ref["exact_accuracy"], color="black", ls="--", lw=1.8, label="exact cache",
                zorder=4)
    first = acc.drop_duplicates("distance_mid")
    ax.set_xticks(first["distance_mid"], [f"{m:.0f}\nn={n}" for m, n in zip(first["distance_mid"], first["examples"])])
    ax.set_ylim(-0.03, 1.05)
    ax.yaxis.set_major_formatter(lambda y, _p: f"{y:.0%}")
    return _finish(ax, legend, "best", title="Recall accuracy by distance", ylabel="exact answers",
                   xlabel="tokens between the fact and the query (bucket middle, n questions)")


def plot_strategies(frame: pd.DataFrame, accuracy: pd.DataFrame | None = None,
                    bytes_per_token: int | None = None) -> Figure:
    """The whole comparison on one page: memory, latency, time in the cache (top); bytes moved by the
    offloaded cache, accuracy vs bits, accuracy by distance (bottom). ``accuracy`` defaults to
    ``frame.attrs["accuracy"]``; without it the two accuracy panels say so."""
    accuracy = accuracy if accuracy is not None else frame.attrs.get("accuracy")
    fig = Figure(figsize=(15, 8.8), layout="constrained")
    (a_mem, a_lat, a_cache), (a_moved, a_bits, a_dist) = fig.subplots(2, 3)
    plot_memory_vs_context(frame, bytes_per_token, ax=a_mem, legend=False)
    plot_latency_vs_context(frame, ax=a_lat, legend=False)
    plot_cache_time(frame, ax=a_cache, legend=False)
    plot_bytes_moved(frame, bytes_per_token, ax=a_moved)
    if accuracy is not None and len(accuracy):
        plot_accuracy_vs_bits(accuracy, ax=a_bits)
        plot_accuracy_by_distance(accuracy, ax=a_dist)
    else:
        for ax in (a_bits, a_dist):
            ax.text(0.5, 0.5, "no accuracy run", ha="center", va="center", transform=ax.transAxes, color="#555")
            ax.set_axis_off()
    handles, labels = a_mem.get_legend_handles_labels()
    extra_h, extra_l = a_cache.get_legend_handles_labels()
    keep = [(h, lab) for h, lab in zip(extra_h, extra_l) if lab.startswith("a whole")]
    handles += [h for h, _ in keep]
    labels += [lab for _, lab in keep]
    fig.legend(handles, labels, loc="outside lower center", ncol=min(5, len(labels)), fontsize=8)
    a = frame.attrs
    if a.get("model"):
        fig.suptitle(f"{a['model']} on {frame['device'].iloc[0]}, {frame['threads'].iloc[0]} thread(s): "
                     f"{a.get('new_tokens', '?')} new tokens per run, {a.get('repeats', '?')} timed runs per point",
                     fontsize=10)
    return fig


_LINES = {"kvlab": "-", "transformers": "--"}


def plot_transformers_caches(frame: pd.DataFrame) -> Figure:
    """Time per token (left) and cache bytes per step (right), kvlab vs transformers, per strategy."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_t, ax_b = fig.subplots(1, 2)
    strategies = list(dict.fromkeys(frame["strategy"]))
    x = np.arange(len(strategies))
    width = 0.38
    for j, lib in enumerate(("kvlab", "transformers")):
        rows = frame[frame["library"] == lib].set_index("strategy").reindex(strategies)
        p50, p95 = rows["token_ms_p50"].to_numpy(float), rows["token_ms_p95"].to_numpy(float)
        pos = x + (j - 0.5) * width
        ax_t.bar(pos, p50, width, color=[cache_color(s) for s in strategies], alpha=0.9 if lib == "kvlab" else 0.45,
                 hatch=None if lib == "kvlab" else "//", edgecolor="black", linewidth=0.5, label=lib)
        ax_t.errorbar(pos, p50, yerr=[np.zeros_like(p50), np.nan_to_num(p95 - p50)], fmt="none", ecolor="black",
                      capsize=3, linewidth=0.8)
        for p in pos[~np.isfinite(p50)]:
            ax_t.text(p, 0, " did not run here", rotation=90, va="bottom", ha="center", fontsize=7)
    ax_t.set_xticks(x, strategies)
    _finish(ax_t, True, "best", grid="y", ylabel="ms per decode token (median, whisker p95)",
            title="time per token: kvlab solid, transformers hatched")

    steps = frame.attrs.get("steps")
    if steps is not None and len(steps):
        first = steps[(steps["question"] == steps["question"].min()) & (steps["repeat"] == steps["repeat"].min())]
        prompt = int(frame["prompt_tokens"].iloc[0])
        for (s, lib), rows in first.groupby(["strategy", "library"], sort=False):
            stored = prompt + rows["token"]
            ax_b.plot(stored, rows["cache_bytes"] / 1024, ls=_LINES[lib], color=cache_color(s), label=f"{s}, {lib}")
            ax_b.plot(stored, rows["formula_bytes"] / 1024, ls="none", marker=".", ms=2.5, color="black")
        ax_b.plot([], [], ls="none", marker=".", color="black", label="formula")
    ax_b.set(xlabel="tokens stored", ylabel="cache KiB after the step", title="cache bytes as tokens are stored")
    ax_b.grid(alpha=0.3)
    ax_b.legend(fontsize=7, ncol=2)
    return fig


RUN_COLORS = {ON_DEVICE: cache_color("dynamic"), OFFLOADED: cache_color("offloaded")}
PLAIN = FuncFormatter(lambda v, _: f"{v:g}")  # 20, not 2 x 10^1, on a log axis


def _log_ms(ax: Axes, **labels) -> None:
    """A panel of milliseconds on a log axis labelled in plain numbers, with its labels, grid and legend."""
    ax.set(**labels)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(PLAIN)
    ax.yaxis.set_minor_formatter(PLAIN)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    ax.title.set_fontsize(10)


def _sorted(ax: Axes, values_s, label: str, color: str) -> None:
    """Every value sorted (x: share of values at most this long), with p50 and p95 marked and n, IQR in the label."""
    v = np.sort(np.asarray(values_s, dtype=float)) * 1e3
    q = spread_stats(v)
    share = np.arange(1, len(v) + 1) / len(v) * 100
    ax.plot(share, v, color=color, lw=1.6,
            label=f"{label}: n = {q['n']}, p50 {q['p50']:.1f}, p95 {q['p95']:.1f}, IQR {q['iqr']:.1f} ms")
    ax.axhspan(q["p25"], q["p75"], xmin=0.0, xmax=0.03, color=color, alpha=0.5)  # the IQR, on the left edge
    for p, marker in ((50, "o"), (95, "D")):
        ax.plot(p, q[f"p{p}"], marker=marker, color=color, ms=5)


def plot_offload_under_load(result: OffloadUnderLoad) -> Figure:
    """Three panels from ``offload_under_load``.

    1. Step times of both runs, each sorted from fastest to slowest (● p50, ◆ p95; the bar on the left edge
       spans p25-p75, the IQR); the legend gives n, p50, p95 and IQR.
    2. Times between tokens (TBT), the same way.
    3. The same steps in both runs against the bytes the offloaded pool moved in them, with the on-device
       time plus bytes / link rate (the least the link adds) for reference.
    """
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    ax_step, ax_tbt, ax_bytes = fig.subplots(1, 3)
    for run, color in RUN_COLORS.items():
        _sorted(ax_step, result.steps.loc[result.steps["run"] == run, "duration_s"], run, color)
        _sorted(ax_tbt, result.gaps.loc[result.gaps["run"] == run, "gap_s"], run, color)
    for ax, what in ((ax_step, "Step time"), (ax_tbt, "Time between tokens")):
        _log_ms(ax, title=f"{what}, fastest to slowest", xlabel="share of values at most this long (%)", ylabel="ms")

    p = paired_steps(result)
    mib = p["bytes_moved"] / 2**20
    ax_bytes.scatter(mib, p["on_device_s"] * 1e3, s=10, color=RUN_COLORS[ON_DEVICE], label=ON_DEVICE)
    ax_bytes.scatter(mib, p["offloaded_s"] * 1e3, s=10, color=RUN_COLORS[OFFLOADED], label=OFFLOADED)
    rate = result.settings.get("link_gbps")
    if rate:
        order = np.argsort(mib.to_numpy())
        floor = (np.median(p["on_device_s"]) + p["bytes_moved"].to_numpy() / (rate * 1e9)) * 1e3
        ax_bytes.plot(mib.to_numpy()[order], floor[order], color="black", ls="--", lw=1,
                      label=f"on-device median + bytes / {rate:g} GB/s")
    _log_ms(ax_bytes, title=f"The same {len(p)} steps in both runs", xlabel="MiB the offloaded pool moved in the step",
            ylabel="ms per step")
    return fig


__all__ = ["expected_bytes_moved", "plot_accuracy_by_distance", "plot_accuracy_vs_bits", "plot_bytes_moved", "plot_cache_time", "plot_latency_vs_context", "plot_memory_vs_context", "plot_offload_cost", "plot_offload_under_load", "plot_strategies", "plot_transformers_caches", "setting_style"]
