"""The room view as matplotlib figures: answers by device, guesses against measurements, hold rates, the room's service curve.

Each function takes a ``kvlab.room.view.Room`` and returns a Figure (no widget: it renders in a saved
notebook, on a projector, under nbval).
"""
from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np

from .view import Room

CLASS_COLORS = {"cpu": "#1f77b4", "cuda": "#d62728", "mps": "#9467bd"}


def answers_figure(room: Room, notebook: str):
    """Every machine's measured answer to each of ``notebook``'s questions (filled, coloured by device class)
    beside its guess (hollow), on a log axis, one row per machine kind (device and threads)."""
    frame = room.measured(notebook).dropna(subset=["measured"])
    questions = list(dict.fromkeys(frame["question"]))
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
        ax.set_yticks(range(len(kinds)), [f"{d[:28]} · {t} thr" for _, d, t in kinds], fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel(q["unit"].iloc[0] or "value")
        ax.set_title(textwrap.fill(textwrap.shorten(q["text"].iloc[0], 110), 60), fontsize=9)
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"{notebook}: everyone's answer, by machine", fontsize=10)
    fig.tight_layout()
    return fig


def guesses_figure(room: Room):
    """Per question, the room's guesses divided by the measurement (log axis): 1 is right, the box is the room."""
    frame = room.measured().dropna(subset=["guess", "measured"])
    frame = frame[(frame["guess_over_measured"] > 0) & np.isfinite(frame["guess_over_measured"])]
    labels = list(dict.fromkeys(frame["notebook"]))
    fig, ax = plt.subplots(figsize=(8, 0.6 + 0.5 * max(len(labels), 1)))
    data = [frame.loc[frame["notebook"] == nb, "guess_over_measured"].to_numpy() for nb in labels]
    ax.boxplot(data, vert=False, widths=0.5)
    ax.set_yticks(range(1, len(labels) + 1), [nb.removesuffix(".ipynb") for nb in labels], fontsize=8)
    ax.axvline(1, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("guess / measured (1 = right; > 1 guessed too high)")
    ax.set_title("where the room's guesses were wrong", fontsize=10)
    fig.tight_layout()
    return fig


def hold_rates_figure(room: Room):
    """Each claim's hold rate across the room, with the number of machines it was checked on."""
    rates = room.hold_rates().sort_values(["notebook", "claim"], ascending=False, ignore_index=True)
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.3 * max(len(rates), 1)))
    colors = ["#1b7f3b" if r == 1 else "#e0a000" if r >= 0.8 else "#b00020" for r in rates["hold_rate"].fillna(0)]
    ax.barh(range(len(rates)), rates["hold_rate"].fillna(0), color=colors)
    for i, row in rates.iterrows():
        ax.text(1.01, i, f"{row['held']}/{row['checked']}", va="center", fontsize=7)
    ax.set_yticks(range(len(rates)), [f"{nb[:2]} {c}" for nb, c in zip(rates["notebook"], rates["claim"])],
                  fontsize=7)
    ax.set_xlim(0, 1.12)
    ax.set_xlabel("share of the room's machines where the claim held")
    ax.set_title("each claim across the room", fontsize=10)
    fig.tight_layout()
    return fig


def service_figure(room: Room, window_s: float = 5.0, **curve_options):
    """Notebook 09, one server for the whole room: the clocks over time as the class piles on (left), and the
    service curve, TTFT and throughput against the offered rate, with the knee (right)."""
    timeline, curve = room.timeline(window_s), room.service_curve(window_s, **curve_options)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
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
    if curve["is_knee"].any():
        knee = float(curve.loc[curve["is_knee"], "offered_rps"].iloc[0])
        right.axvline(knee, color="#b00020", lw=1)
        right.annotate(f"knee {knee:.3g}/s", (knee, right.get_ylim()[1] * 0.9), color="#b00020", fontsize=8)
    right.legend(fontsize=8, loc="upper left")
    right.set_title("one service curve from everyone's requests", fontsize=10)
    fig.tight_layout()
    return fig
