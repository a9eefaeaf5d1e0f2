"""The room view as matplotlib figures: answers by device, guesses against measurements, hold rates, the room's service curve.

Each function takes a ``kvlab.room.view.Room`` and returns a Figure (no widget: it renders in a saved
notebook, on a projector, under nbval). Whatever a learner typed (a device, a question, a unit, a claim's
name) is drawn as plain text through ``plain``: clipped, with matplotlib's math (``$...$``) and TeX off, so
no learner's text can break a figure. A room with nothing to show gets a figure that says so.
"""
from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.text import Text

from kvlab.room.view import Room

CLASS_COLORS = {"cpu": "#1f77b4", "cuda": "#d62728", "mps": "#9467bd"}


def plain(text, limit: int = 60) -> str:
    """A learner's ``text`` as matplotlib draws it literally: at most ``limit`` characters, ``$`` escaped (no math)."""
    text = " ".join(str(text).split())  # one line: no newline or tab from a learner
    if len(text) > limit:
        text = text[:limit - 1] + "…"
    return text.replace("$", r"\$")


def _finish(fig):
    """Lay ``fig`` out with every text drawn without TeX, whatever the teacher's rcParams say (``plain`` escapes
    math; TeX would read it all). Set on the texts themselves, before the layout measures them: tick labels made
    later copy their first tick's setting (an rc_context would also undo what the notebook's backend set)."""
    for text in fig.findobj(Text):
        text.set_usetex(False)
    fig.tight_layout()
    return fig


def _nothing(title: str, why: str):
    fig, ax = plt.subplots(figsize=(8, 1.5))
    ax.axis("off")
    ax.text(0.5, 0.5, why, ha="center", va="center", fontsize=10)
    ax.set_title(title, fontsize=10)
    return _finish(fig)


def answers_figure(room: Room, notebook: str):
    """Every machine's measured answer to each of ``notebook``'s questions (filled, coloured by device class)
    beside its guess (hollow), on a log axis, one row per machine kind (device and threads)."""
    frame = room.measured(notebook).dropna(subset=["measured"])
    frame = frame[frame["measured"] > 0]  # a log axis
    questions = list(dict.fromkeys(frame["question"]))
    if not questions:
        return _nothing(f"{notebook}: everyone's answer", "no measured answers in this room")
    fig, axes = plt.subplots(1, max(len(questions), 1), figsize=(7 * max(len(questions), 1), 0.5 + 0.45 * max(
        frame.groupby(["device", "threads"]).ngroups, 2)), squeeze=False)
    for ax, question in zip(axes[0], questions):
        q = frame[frame["question"] == question]
        kinds = q.groupby(["device_class", "device", "threads"]).size().index.tolist()
        for y, (cls, device, threads) in enumerate(kinds):
            g = q[(q["device"] == device) & (q["threads"] == threads)]
            jitter = np.linspace(-0.15, 0.15, len(g)) if len(g) > 1 else [0.0]
            color = CLASS_COLORS.get(cls, "gray")
            ax.scatter(g["measured"], y + np.asarray(jitter), color=color, s=30, zorder=3,
                       label="measured" if y == 0 else None)
            ax.scatter(g["guess"], y + np.asarray(jitter), facecolors="none", edgecolors=color, s=30, alpha=0.6,
                       label="guessed" if y == 0 else None)
        ax.set_yticks(range(len(kinds)), [f"{plain(d, 28)} · {plain(t, 4)} thr" for _, d, t in kinds], fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel(plain(q["unit"].iloc[0] or "value", 30))
        ax.set_title(textwrap.fill(plain(q["text"].iloc[0], 110), 60, break_long_words=False), fontsize=9)
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"{notebook}: everyone's answer, by machine", fontsize=10)
    return _finish(fig)


def guesses_figure(room: Room):
    """Per question, the room's guesses divided by the measurement (log axis): 1 is right, the box is the room."""
    frame = room.measured().dropna(subset=["guess", "measured"])
    frame = frame[(frame["guess_over_measured"] > 0) & np.isfinite(frame["guess_over_measured"])]
    labels = list(dict.fromkeys(frame["notebook"]))
    if not labels:
        return _nothing("where the room's guesses were wrong", "no guesses in this room")
    fig, ax = plt.subplots(figsize=(8, 0.6 + 0.5 * max(len(labels), 1)))
    data = [frame.loc[frame["notebook"] == nb, "guess_over_measured"].to_numpy() for nb in labels]
    ax.boxplot(data, vert=False, widths=0.5)
    ax.set_yticks(range(1, len(labels) + 1), [plain(nb.removesuffix(".ipynb"), 40) for nb in labels], fontsize=8)
    ax.axvline(1, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("guess / measured (1 = right; > 1 guessed too high)")
    ax.set_title("where the room's guesses were wrong", fontsize=10)
    return _finish(fig)


def hold_rates_figure(room: Room):
    """Each claim's hold rate across the room, with the number of machines it was checked on."""
    rates = room.hold_rates().sort_values(["notebook", "claim"], ascending=False, ignore_index=True)
    if rates.empty:
        return _nothing("each claim across the room", "no claims were checked in this room")
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.3 * len(rates)))
    colors = ["#1b7f3b" if r == 1 else "#e0a000" if r >= 0.8 else "#b00020" for r in rates["hold_rate"].fillna(0)]
    ax.barh(range(len(rates)), rates["hold_rate"].fillna(0), color=colors)
    for i, row in rates.iterrows():
        ax.text(1.01, i, f"{row['held']}/{row['checked']}", va="center", fontsize=7)
    ax.set_yticks(range(len(rates)), [f"{plain(nb, 2)} {plain(c, 50)}" for nb, c in zip(rates["notebook"],
                                                                                          rates["claim"])], fontsize=7)
    ax.set_xlim(0, 1.12)
    ax.set_xlabel("share of the room's machines where the claim held")
    ax.set_title("each claim across the room", fontsize=10)
    return _finish(fig)


def service_figure(room: Room, window_s: float = 5.0, **curve_options):
    """Notebook 09, one server for the whole room: the clocks over time as the class piles on (left), the
    service curve, TTFT and throughput against the offered rate, with the knee (middle), and beside it the share
    of each rate's requests the server refused (429) or that failed otherwise (right)."""
    timeline, curve = room.timeline(window_s), room.service_curve(window_s, **curve_options)
    if curve.empty:
        return _nothing("one service curve from everyone's requests", "no pooled 09 requests in this room")
    fig, (left, right, shares) = plt.subplots(1, 3, figsize=(16, 4), gridspec_kw={"width_ratios": [3, 3, 2]})
    left.plot(timeline["t_s"], timeline["ttft_p50_s"], "o-", label="TTFT p50")
    left.plot(timeline["t_s"], timeline["ttft_p95_s"], "o--", label="TTFT p95")
    left.plot(timeline["t_s"], timeline["e2e_p50_s"], "s-", label="E2E p50")
    left.plot(timeline["t_s"], timeline["tpot_p50_s"] * 100, "^-", label="TPOT p50 ×100")
    left.set_xlabel(f"seconds since the room's first request ({window_s:g} s windows)")
    left.set_ylabel("seconds")
    twin = left.twinx()
    twin.bar(timeline["t_s"], timeline["learners"], width=window_s * 0.8, align="edge", alpha=0.15, color="gray")
    twin.set_ylabel("learners sending")
    left.legend(fontsize=8, loc="upper left")
    left.set_title("the whole class piling on", fontsize=10)
    right.plot(curve["offered_rps"], curve["ttft_p50_s"], "o-", label="TTFT p50")
    right.plot(curve["offered_rps"], curve["ttft_p95_s"], "o--", label="TTFT p95")
    for _, row in curve.iterrows():
        right.annotate(f"n={row['ttft_n']}", (row["offered_rps"], row["ttft_p95_s"]), fontsize=7,
                       textcoords="offset points", xytext=(3, 3))
    right.set_xlabel("offered requests / s (the room's arrivals)")
    right.set_ylabel("seconds")
    tput = right.twinx()
    tput.plot(curve["offered_rps"], curve["achieved_rps"], "k.-", label="achieved req/s")
    top = max(curve["offered_rps"].max(), curve["achieved_rps"].max())
    tput.plot([0, top], [0, top], color="gray", lw=0.8, ls=":")
    tput.set_ylabel("achieved requests / s")
    tput.legend(fontsize=8, loc="lower right")
    rates = curve["offered_rps"].to_numpy()
    width = 0.35 * float(np.min(np.diff(rates)) if len(rates) > 1 else rates[0])
    shares.bar(curve["offered_rps"], curve["refused"], width=width, color="#b00020", label="refused (429)")
    shares.bar(curve["offered_rps"], curve["failed_otherwise"], width=width, bottom=curve["refused"], color="#e0a000",
               label="failed otherwise")
    for _, row in curve.iterrows():
        shares.annotate(f"n={row['requests']}", (row["offered_rps"], row["refused"] + row["failed_otherwise"]),
                        fontsize=7, ha="center", textcoords="offset points", xytext=(0, 3))
    shares.set_ylim(0, 1.08)
    shares.set_xlabel("offered requests / s")
    shares.set_ylabel("share of the rate's requests")
    shares.legend(fontsize=8, loc="upper left")
    shares.set_title("what the server did not serve", fontsize=10)
    knee = room.knee_rps(window_s=window_s, **curve_options)
    if knee.rps is not None:
        for ax in (right, shares):
            ax.axvline(knee.rps, color="#b00020", lw=1)
        right.annotate(f"knee {knee.rps:.3g}/s", (knee.rps, right.get_ylim()[1] * 0.9), color="#b00020", fontsize=8)
    else:
        right.annotate(plain(knee.message, 70), (0.02, 0.02), xycoords="axes fraction", fontsize=7, color="#b00020")
    right.legend(fontsize=8, loc="upper left")
    right.set_title("one service curve from everyone's requests", fontsize=10)
    return _finish(fig)
