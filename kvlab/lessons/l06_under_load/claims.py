"""Claims of notebook 06 (under load), checked on the learner's runs.

Four results of the notebook are read here:

- ``check`` (``simulated_vs_real``): the same loads served by the real small model (wall clock)
  and by the simulator calibrated a moment before; the claims are ``wall``;
- ``curves`` (``service_curves``): simulated service curves on the shipped calibration (virtual
  time: ``deterministic``), plus one ``wall`` observation (•) of how fast the simulator ran;
- ``exact`` (``service_curve`` on a round-number cost model): counts at the window's end;
- ``ab`` (``ab_at_two_loads``): the two scheduling rules below capacity and overloaded.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from kvlab.experiments.service_curves import DEFAULT_SLO, real_vs_simulated
from kvlab.lessons.common.checks import TIE, rises_at_every_level, series
from kvlab.lessons.common.claims import SHOWN_ONLY, claim

NOTEBOOK = "06_under_load.ipynb"
PROFILE_WORDS = {"short_short": "short chats", "long_short": "long prompts", "long_gen": "long answers",
                 "mixture": "the mixture"}


# -- helpers ----------------------------------------------------------------------------------------------
def _n(values: Sequence[int]) -> str:
    """One n when every level has the same, else the list."""
    values = [int(v) for v in values]
    return str(values[0]) if len(set(values)) == 1 else "/".join(map(str, values))


def _label(clock: str) -> str:
    """"ttft_p95_s" -> "TTFT p95"."""
    name, q = clock.removesuffix("_s").split("_", 1)
    return f"{name.upper()} {q}"


def _gap(check: pd.DataFrame) -> pd.DataFrame:
    return real_vs_simulated(check).sort_values(["clock", "offered_rps"])


# -- the simulator against the real model (wall clock) -----------------------------------------------------
@claim(NOTEBOOK, clock="wall", asserts=False,
       says="""
           at the highest load ({rate:g} req/s offered, past the estimated capacity: a burst of {n} requests sent in
           about {span:.2f} s, so the engine's speed decides when they are done) the real model served {real:.1f}
           requests/s and the simulator {sim:.1f}: real ÷ simulated {ratio:.2f}, within a quarter. The lower loads do not test the simulator: both runs
           replay the same arrivals and serve what arrives (real ÷ simulated {low})""",
       otherwise="""
           the real model served noticeably less (or more) than the simulator predicted where throughput is set by
           the engine. Usually the machine was busier during the real run than during the calibration a moment
           before (other programs, another notebook), so real steps took longer than the cost model says. Run the
           cell again: it calibrates and checks together, so both see the same moment of the machine.""")
def simulator_throughput_close_to_real(check: Any) -> dict:
    """Decided at the highest load alone. Below capacity a level's throughput is its arrivals: the real run and the
    simulated one replay the same arrival times, so their ratio is about 1 whatever the cost model says. The notebook
    sets the highest load past the capacity the cost model estimates, where the engine's speed decides what is
    served."""
    g = _gap(check)
    t = g[g["clock"] == "achieved_rps"].sort_values("offered_rps")
    if len(t) < 2:
        raise ValueError(f"the check has {len(t)} load level(s); the claim reads the highest beside the lower ones")
    top = t.iloc[-1]
    return dict(rate=float(top["offered_rps"]), real=float(top["real"]), sim=float(top["simulated"]),
                ratio=float(top["ratio"]), n=int(top["n_real"]), span=int(top["n_real"]) / float(top["offered_rps"]),
                low=series(t["ratio"].iloc[:-1], "{:.2f}", sep=", "), **{SHOWN_ONLY: SIMULATOR_SHOWN},
                holds=0.8 <= float(top["ratio"]) <= 1.25)


# The agreement the course asks of a simulator calibrated on this machine a moment before the real run: every median
# within this factor of the real one, either way. A fixed goal, not a margin from the run's noise (a median of 30
# requests moves by a few percent; the simulator's misses are its model's, and the machine changing between the
# calibration and the run): the sentence says so.
SIMULATOR_GOAL = 2.0
# The simulator checks held in 8 of 10 executions of 06 on a quiet 2-core machine (the medians) and in 5 of 10 beside a
# competing load (the throughput; notebooks/key_ranges.json), short of the course's 9 and 8: the real run and the
# calibration a moment before it see different moments of a shared machine. So they are shown (•) with their numbers,
# not marked, and the lesson's point (the service curve, on the virtual clock) is decided elsewhere.
SIMULATOR_SHOWN = ("a simulator calibrated a moment before and the real run see two moments of a shared machine: the "
                   "agreement moved with the machine's load in 2 of 10 quiet and 5 of 10 loaded runs of this notebook")


@claim(NOTEBOOK, clock="wall", asserts=False,
       says="""
           the medians met the course's goal for a simulator calibrated a moment before, within a factor of
           {goal:g} either way (a fixed goal, not a margin from this run's noise); real ÷ simulated, lowest to
           highest load: TTFT p50 {ttft_p50}; TPOT p50 {tpot_p50}; and in the tails TTFT p95 {ttft_p95}, E2E p95
           {e2e_p95} (n = {n} completed requests per load and source); largest gap: {worst}""",
       otherwise="""
           a median is more than twice (or less than half) what the simulator predicted, so it missed the goal. The
           cost model was fit on this machine a moment ago, so this is mostly the machine's load changing between
           the calibration and the real run, or the real run falling behind at the highest load, where a slightly
           slower step changes which requests are batched together. Read the ratios, not one number: the tails
           move the most (a p95 of a few dozen requests rests on its slowest two or three).""")
def simulator_medians_within_factor_two(check: Any) -> dict:
    g = _gap(check)
    by = {c: g[g["clock"] == c] for c in ("ttft_p50_s", "tpot_p50_s", "ttft_p95_s", "e2e_p95_s")}
    latency = g[g["clock"] != "achieved_rps"]
    off = latency.assign(away=[max(r, 1 / r) if r > 0 else float("inf") for r in latency["ratio"]])
    w = off.sort_values("away").iloc[-1]
    worst = (f"{_label(w['clock'])} at {w['offered_rps']:g} req/s, real "
             f"{w['real'] * 1e3:.1f} ms vs simulated {w['simulated'] * 1e3:.1f} ms ({w['ratio']:.2f}×)")
    medians = pd.concat([by["ttft_p50_s"]["ratio"], by["tpot_p50_s"]["ratio"]])
    return dict(**{k.removesuffix("_s"): series(v["ratio"], "{:.2f}", sep=", ") for k, v in by.items()},
                n=_n(pd.concat([by["ttft_p50_s"]["n_real"], by["ttft_p50_s"]["n_simulated"]])), worst=worst,
                goal=SIMULATOR_GOAL, **{SHOWN_ONLY: SIMULATOR_SHOWN},
                holds=bool(((medians >= 1 / SIMULATOR_GOAL) & (medians <= SIMULATOR_GOAL)).all()))


RISING_CLOCKS = ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s")  # the medians: a p95 of a few dozen requests rests on 1-2


@claim(NOTEBOOK, clock="wall", asserts=False,
       says="""
           the medians rose with the load, on the real model and in the simulator (lowest to highest load, real |
           simulated): TTFT p50 {ttft_real} | {ttft_sim} ms; TPOT p50 {tpot_real} | {tpot_sim} ms; E2E p50
           {e2e_real} | {e2e_sim} ms. Each rose by more than {tie:.0%} from the lowest load to the highest and fell
           by no more than {tie:.0%} from one level to the next (a fixed tie for two light loads, not a margin from
           this run's noise). {verdict}""",
       otherwise="""
           a median fell by more than the tie from one load to the next, or the highest load's was not above the
           lowest's by more than it. The machine's load most likely changed during the run (another program started or
           stopped), so the levels were served by a faster or slower machine; more requests per level steady the
           medians.""")
def real_and_simulated_rise_with_load(check: Any) -> dict:
    """Every median clock rises level by level up to ``checks.TIE``: no level below the one before by more than that
    share (two light loads give the same median up to jitter), and the last above the first by more than the same
    share. The tails (p95) are compared in ``simulator_medians_within_factor_two``, not here: a p95 of a few dozen
    requests rests on the slowest one or two, and on a shared machine it goes up and down between levels."""
    values, falls = {}, []
    for source in ("real", "simulated"):
        rows = check[check["source"] == source].sort_values("offered_rps")
        if len(rows) < 2:
            raise ValueError(f"the check has {len(rows)} {source} load level(s); a rise needs two or more")
        for clock in RISING_CLOCKS:
            name = clock.split("_")[0]
            values[f"{name}_{source[:4].rstrip('u')}"] = series(rows[clock], "{:.1f}", 1e3)
            if not rises_at_every_level(rows[clock], overall=1 + TIE):
                falls.append(f"{_label(clock)} ({source})")
    verdict = ("Both have the same shape" if not falls else f"Not so: {', '.join(falls)}")
    return dict(**values, tie=TIE, verdict=verdict, holds=not falls, **{SHOWN_ONLY: SIMULATOR_SHOWN})


# -- the service curves (virtual time on the shipped calibration) ------------------------------------------
def _knees(curves: pd.DataFrame) -> dict[str, float | None]:
    return {p: float(c.loc[c["is_knee"], "offered_rps"].iloc[0]) if c["is_knee"].any() else None
            for p, c in curves.groupby("profile", sort=False)}


def _grid_steps(curves: pd.DataFrame) -> dict[str, float]:
    """Each curve's step between tested loads (req/s): a capacity read off the grid is known to one step."""
    return {p: float(np.median(np.diff(np.sort(c["offered_rps"].to_numpy())))) if len(c) > 1 else float("nan")
            for p, c in curves.groupby("profile", sort=False)}


@claim(NOTEBOOK, clock="wall", asserts=False,
       says="""
           the simulator served {levels} levels, {requests} requests in all, in {wall:.1f} s of this machine's
           time; the real model would have needed about {virtual:.0f} s of serving on the authors' machine (each
           level from first arrival to last answer): {speed:.0f}× faster than real time. An observation, not a
           check: the simulator computes no model, only a few sums per step, so no machine makes it slow""",
       otherwise="""
           (an observation: never marked ✗) the sweep's speed depends on this machine; its times are the cost
           model's, not this run's.""")
def simulator_much_faster_than_real_time(curves: Any) -> dict:
    """Shown, not asserted: virtual > 10 × wall could not fail on any machine a notebook runs on, since a simulated
    step costs microseconds of arithmetic against the milliseconds it stands for."""
    wall, virtual = float(curves["run_wall_s"].sum()), float(curves["makespan_s"].sum())
    return dict(levels=len(curves), requests=int(curves["requests"].sum()), wall=wall, virtual=virtual,
                speed=virtual / wall, holds=True)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           capacity at the TTFT target (± one grid step): {knees}; long prompts reach it at {prompts:.0%} and long
           answers at {answers:.0%} of the request rate of short chats""",
       otherwise="""
           long prompts or long answers did not bend at under half the request rate of short chats. With a
           different cost model (another machine's calibration) or scheduler settings the ratio moves: compare the
           knees in the table.""")
def long_traffic_bends_at_lower_rate(curves: Any) -> dict:
    knees, steps = _knees(curves), _grid_steps(curves)
    text = "; ".join(f"{PROFILE_WORDS.get(p, p)} {'no knee' if k is None else f'{k:.3g} req/s'} "
                     f"(grid step {steps[p]:.2g})" for p, k in knees.items())
    short, prompts, answers = (knees.get(p) for p in ("short_short", "long_short", "long_gen"))
    if short is None or prompts is None or answers is None:
        return dict(knees=text, prompts=float("nan"), answers=float("nan"), holds=None)
    return dict(knees=text, prompts=prompts / short, answers=answers / short,
                holds=prompts < 0.5 * short and answers < 0.5 * short)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           p95 TTFT already climbs below the knee (lowest load to the knee: {below}), and on past it (highest load
           against the knee: {growth}); no request was refused up to any knee, and at the highest load the full
           queue refused {refused}""",
       otherwise="""
           past the knee TTFT did not climb at least 1.5× in every curve, requests were refused below a knee, or
           none at all. With a longer queue limit or loads that stop just past the knee the climb is smaller and
           refusals rarer; read the curves.""")
def latency_climbs_and_refusals_start_past_the_knee(curves: Any) -> dict:
    """Decides the climb past the knee and the refusals; the rise below the knee is quoted, not checked (the notebook
    says what the curve shows: the slowest first tokens climb before the knee, up to the target that defines it)."""
    growth, below, refused, ok, refusals = [], [], [], True, 0
    for profile, c in curves.groupby("profile", sort=False):
        c = c.sort_values("offered_rps")
        word = PROFILE_WORDS.get(profile, profile)
        if not c["is_knee"].any():
            growth.append(f"{word} no knee")
            ok = False
            continue
        knee = c.index[c["is_knee"]][0]
        top = c.iloc[-1]
        below.append(f"{word} {float(c.loc[knee, 'ttft_p95_s'] / c.iloc[0]['ttft_p95_s']):.1f}×")
        g = float(top["ttft_p95_s"] / c.loc[knee, "ttft_p95_s"])
        growth.append(f"{word} {g:.1f}× (n = {int(c.loc[knee, 'ttft_n'])}, then {int(top['ttft_n'])})")
        refused.append(f"{top['failure_rate']:.0%} ({word})")
        refusals += int(top["failed"])
        ok &= g > 1.5 and int(c.loc[:knee, "failed"].sum()) == 0
    return dict(growth="; ".join(growth), below=", ".join(below) or "no knee", refused=", ".join(refused) or "none",
                holds=ok and refusals > 0)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           at {rate:g} req/s the p95 TTFT is computed over n = {n} completed requests of {sent} sent: {failed}
           were refused, and when the sending window closed {waiting} were still waiting and {running} running""",
       otherwise="""
           at the highest load every request sent was completed: no refusals, so the quantile's n is the whole
           load. Raise the load or shorten the queue limit to see the counts part.""")
def quantile_counts_fewer_than_sent(exact: Any) -> dict:
    top = exact.sort_values("offered_rps").iloc[-1]
    return dict(rate=float(top["offered_rps"]), n=int(top["ttft_n"]), sent=int(top["sent"]),
                failed=int(top["failed"]), waiting=int(top["window_waiting"]), running=int(top["window_running"]),
                holds=int(top["ttft_n"]) < int(top["sent"]) and int(top["failed"]) > 0)


# -- the A/B example (virtual time on the shipped calibration) ---------------------------------------------
def _ab(ab: pd.DataFrame, load: str) -> tuple[pd.Series, pd.Series]:
    rows = ab[ab["load"] == load].set_index("policy")
    return rows.loc["A"], rows.loc["B"]


@claim(NOTEBOOK, clock="deterministic",
       says="""
           overloaded ({rate:.3g} req/s): B streamed {b_tps:.1f} output tokens/s, {ratio:.2f}× A's {a_tps:.1f}, yet
           its p95 first token came later: {b_ttft:.2f} s against A's {a_ttft:.2f} s, over every request sent
           (n = {b_n} and {a_n}, each followed to its first token)""",
       otherwise="""
           here one rule did not win on throughput while losing on first tokens. On another cost model (another
           machine's calibration) the overloaded level can land where the two rules do the same; compare the rows
           of the table.""")
def ab_overloaded_more_throughput_later_first_token(ab: Any) -> dict:
    """Decided on every request sent (followed to its first token), never on the completed ones only: those
    drop the requests still waiting at the close, the longest waits (survivor bias)."""
    a, b = _ab(ab, "overloaded")
    return dict(rate=float(a["offered_rps"]), window=float(a["window_s"]), b_tps=float(b["output_tokens_per_s"]),
                a_tps=float(a["output_tokens_per_s"]), ratio=float(b["output_tokens_per_s"] / a["output_tokens_per_s"]),
                b_done=int(b["completed"]), a_done=int(a["completed"]), b_ttft=float(b["ttft_p95_sent_s"]),
                a_ttft=float(a["ttft_p95_sent_s"]), b_n=int(b["ttft_sent_n"]), a_n=int(a["ttft_sent_n"]),
                b_open=int(b["ttft_censored"]), a_open=int(a["ttft_censored"]),
                b_close=float(b["ttft_p95_close_s"]), a_close=float(a["ttft_p95_close_s"]),
                b_done_ttft=float(b["ttft_p95_s"]), a_done_ttft=float(a["ttft_p95_s"]),
                holds=b["output_tokens_per_s"] > 1.2 * a["output_tokens_per_s"] and
                b["ttft_p95_sent_s"] > 1.3 * a["ttft_p95_sent_s"])


@claim(NOTEBOOK, clock="deterministic",
       says="""
           overloaded, once an answer started, B produced a token every {b_tpot:.3f} s at the median and A every
           {a_tpot:.3f} s ({times:.1f}× longer; n = {b_n} and {a_n}): A's prompt-only steps pause every running
           answer""",
       otherwise="""
           A's time per output token was not clearly longer than B's. With few prompts arriving, A rarely pauses
           its answers; at a higher load the pauses show.""")
def ab_overloaded_prefill_first_streams_slower(ab: Any) -> dict:
    a, b = _ab(ab, "overloaded")
    return dict(b_tpot=float(b["tpot_p50_s"]), a_tpot=float(a["tpot_p50_s"]),
                times=float(a["tpot_p50_s"] / b["tpot_p50_s"]), b_n=int(b["tpot_n"]), a_n=int(a["tpot_n"]),
                holds=a["tpot_p50_s"] > 2 * b["tpot_p50_s"])


@claim(NOTEBOOK, clock="deterministic",
       says="""
           below capacity ({rate:.3g} req/s) both keep up: A served {a_share:.0%} and B {b_share:.0%} of the
           requests/s sent, and their p95 first token over every request sent came at {a_ttft:.2f} s and
           {b_ttft:.2f} s (n = {a_n} and {b_n}), within the {slo:g} s target""",
       otherwise="""
           at the lower load one rule fell behind or missed the TTFT target, on the requests it completed or on
           every request it was sent (those still waiting at the close followed to their first token). Lower
           low_fraction in ab_at_two_loads until both keep up: the trade-off only appears once requests must
           wait.""")
def ab_below_capacity_both_keep_up(ab: Any) -> dict:
    """The target is checked over every request sent, each followed to its first token (as the overloaded claim
    decides), and over the completed ones: the completed alone leave out those still waiting at the close, the
    longest waits, so the sentence quotes the p95 over every request sent."""
    a, b = _ab(ab, "below capacity")
    slo = DEFAULT_SLO.ttft_s
    return dict(rate=float(a["offered_rps"]), a_share=float(a["throughput_ratio"]),
                b_share=float(b["throughput_ratio"]), a_done=int(a["completed"]), b_done=int(b["completed"]),
                sent=int(a["sent"]), a_ttft=float(a["ttft_p95_sent_s"]), b_ttft=float(b["ttft_p95_sent_s"]), slo=slo,
                a_tpot=float(a["tpot_p50_s"]), b_tpot=float(b["tpot_p50_s"]), a_n=int(a["ttft_sent_n"]),
                b_n=int(b["ttft_sent_n"]), a_tn=int(a["tpot_n"]), b_tn=int(b["tpot_n"]),
                holds=bool(a["keeps_up"] and b["keeps_up"])
                and max(a["ttft_p95_s"], b["ttft_p95_s"], a["ttft_p95_sent_s"], b["ttft_p95_sent_s"]) <= slo)
