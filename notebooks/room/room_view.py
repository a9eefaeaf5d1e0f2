# %% [markdown]
# # The room: a workshop measured together (teacher's notebook)
#
# Every lesson measures one learner's machine. This notebook shows the room: the same experiments,
# everyone's numbers side by side, where the room's guesses were wrong, which claims held on which
# machines, the machines that disagree with the rest, and one service curve drawn from everyone's
# requests to the one server the room shared (notebook 09).
#
# It reads a **room**: the collector's database (`room.sqlite`), a room file it exported, a folder of
# learners' files, or the collector's address. By default it reads `sample_room.json` beside it:
# thirty simulated learners (`scripts/make_sample_room.py`, seeded), so it can be rehearsed before the
# workshop. During a workshop, start it with `KVLAB_ROOM=room.sqlite` (or set `ROOM` below).
#
# Starting a room is two commands (TEACHING.md, "Running a room"):
#
# ```bash
# KVLAB_ROOM_KEY=tulip-42 python -m kvlab room --host 0.0.0.0 --db room.sqlite --inbox dropped/
# KVLAB_ROOM=room.sqlite jupyter lab notebooks/room/room_view.ipynb
# ```

# %%
import os

import pandas as pd

from kvlab.room.figures import answers_figure, guesses_figure, hold_rates_figure, service_figure
from kvlab.room.view import load_room

ROOM = os.environ.get("KVLAB_ROOM", "sample_room.json")  # a .sqlite, a room .json, a folder, or http://host:8100
pd.set_option("display.width", 160)
pd.set_option("display.max_colwidth", 60)
room = load_room(ROOM)
print(room.summary())

# %% [markdown]
# ## Who is in the room
#
# One row per learner: the device, the threads torch used, where it ran, the kvlab version (a `*`
# after a name, in every table, marks a file from another kvlab version: accepted, but measured by
# other code), and how many notebooks they shared.

# %%
# NBVAL_CHECK_OUTPUT
learners = room.learners()
print(learners.groupby(["device_class", "runtime"]).size().rename("learners").to_string())
learners

# %% [markdown]
# ## Everyone's answer, by device and threads
#
# Per notebook: each question's measured answer grouped by machine (n, median, range, who). A number
# every machine measures alike (02's bytes against the formula) is a count; a number that moves with
# the machine (01's late/early ratio) is a time, and the table shows by how much.

# %%
# NBVAL_CHECK_OUTPUT
notebooks = sorted({run.notebook for run in room.runs})
for notebook in notebooks:
    print(f"\n== {notebook}")
    print(room.by_device(notebook).drop(columns="question").to_string(index=False, float_format="{:.3g}".format))

# %%
# the first notebook with measured answers (any notebook: the figure says so when there are none)
answered = [nb for nb in notebooks if room.measured(nb)["measured"].notna().any()] or notebooks or ["(none)"]
answers_figure(room, answered[0]);

# %% [markdown]
# ## The room's guesses against the measurements
#
# `room_error_x` is the median of guess / measured over the room (1: the room was right; 2: it
# guessed twice too high); `within_2x` is the share of learners whose guess was within a factor 2.

# %%
# NBVAL_CHECK_OUTPUT
guesses = room.guesses()
guesses.assign(question=guesses["question"].str.slice(0, 40)).round(3)

# %%
guesses_figure(room);

# %% [markdown]
# ## Each claim across the room
#
# A claim checked on one machine is an anecdote; checked on thirty it has a hold rate. Where it did
# not hold, the machines are named with their settings: the place to start a discussion.

# %%
# NBVAL_CHECK_OUTPUT
room.hold_rates().round(3)

# %%
hold_rates_figure(room);

# %% [markdown]
# ## Machines that disagree with the rest
#
# Robust z-score on log values, within the device class when it has at least four machines, else
# against the whole room (`kvlab.room.view`): |z| > 3.5 is named. A GPU's 01 ratio near 1 is not a
# mistake (a tiny model's step there is launch-bound); a CPU far from the other CPUs is worth a look at
# its threads and what else ran on it.

# %%
# NBVAL_CHECK_OUTPUT
room.outliers().round(3)

# %%
headline = {nb: room.figures(nb) for nb in notebooks}
headline[answered[0]].head(10) if answered[0] in headline else "no notebook shared yet"

# %% [markdown]
# ## One server, the whole room
#
# Every learner ran notebook 09's client against the teacher's one `kvlab serve`, at about the same
# moment. Their per-request records, pooled on one time axis, give the room's four clocks as the class
# piled on and one service curve.
#
# **Where each run goes.** Each file says when its client's clock started, on the learner's wall
# clock; the collector measured that clock against its own when the file was sent, and a run is moved
# by the difference. A run whose times cannot be right against when it arrived (its requests end after
# the collector received it, or it came long after its run with the clock never checked) is left out
# and named below, and so is a second copy of the same run shared under another name.

# %%
# NBVAL_CHECK_OUTPUT
placements = room.placements()
print(f"{int(placements['pooled'].sum())} of {len(placements)} runs with requests pooled")
placements[placements["note"].notna()][["learner", "requests", "shift_s", "pooled", "note"]]

# %% [markdown]
# **The curve.** Requests grouped by the offered rate of the window they arrived in, with n; beside
# the clocks, the share of each rate's requests the server refused (429: its queue was full) or that
# failed otherwise. The knee is the busiest rate before the first where the server stopped keeping up
# (under 90 % of requests served, or TTFT p95 over 1 s; `room.service_curve(slo_ttft_s=...)` sets the
# room's own target); when there is none, the line says whether every rate kept up or the server was
# behind from the start.

# %%
# NBVAL_CHECK_OUTPUT
curve = room.service_curve()
print(f"knee: {room.knee_rps()}")
columns = ["rate_from", "rate_to", "requests", "learners", "offered_rps", "achieved_rps", "throughput_ratio", "served",
           "refused", "failed_otherwise", "ttft_n", "ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "e2e_p95_s", "is_knee"]
curve[columns].round(3) if len(curve) else "no notebook-09 requests pooled in this room"

# %% [markdown]
# The requests themselves, with why each that was not served ended (`fail_reason`: `http_429:...`
# refused by a full queue, `timeout`, `deadline`, ...):

# %%
# NBVAL_CHECK_OUTPUT
requests = room.requests()
requests.groupby(["status", "fail_reason"], dropna=False).size().rename("requests").reset_index()

# %%
service_figure(room);
