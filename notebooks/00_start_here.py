# %% [markdown]
# <!-- kvlab:header -->
# kvlab is a lab about one question: **why can an AI service that is fast on paper still keep a
# person waiting?** Every notebook asks one part of that question, runs an experiment and plots
# what happened. The decoder, its KV caches, the serving engine and the timers are the code in the
# `kvlab` package, which you can open and read. Not every time you will see is measured, though,
# and each notebook says which clock its numbers come from:
#
# - **your machine's wall clock**: a real (small) Transformer runs and is timed, step by step in
#   *The slowdown* and *Cache strategies*, request by request through kvlab's serving engine in
#   *The four clocks*, *Batching* and *Preemption, prefixes and chunks*, and at the client of a
#   real HTTP server in *Measure a real server*. (*The KV cache* and *Memory is capacity* count
#   bytes and blocks, not time.)
# - **a virtual clock**: the serving notebooks also replay the same requests with each step priced
#   at a fixed cost instead of running the model. The scheduler's decisions are the real ones, but
#   every timestamp can be worked out by hand and is the same on every machine, so those cells are
#   checked exactly.
# - **a simulator**: *Under load* needs hundreds of requests at each of many loads for one service
#   curve, which the real model would take many minutes to serve. There the engine prices each step
#   with a cost model fitted to timings of the real model, instead of running it, on a virtual
#   clock. Its big sweeps use a cost model fitted on the authors' machine; the notebook also fits
#   one on yours and checks it against the real model on your wall clock.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - say which machine your numbers come from (device, library versions, CPU threads) and why that matters;
# - say which clock a time comes from (your wall clock, a virtual clock, a simulator) and read the
#   ✓/✗ line that checks a sentence on your own run;
# - find your way through the notebook sequence and the package layers behind it;
# - drive a **panel**: choose settings, press **Run**, watch the progress bar, read the figure;
# - run the lab locally, on Binder or on Colab.

# %% [markdown]
# ## 1. Your machine
#
# Every measured time in this lab depends on these few lines. When you compare a result with a
# neighbour's, compare these first: a laptop with fast cores usually gives smaller numbers than a
# shared 2-core Binder session. What the lessons are about is the **shape** of a result (flat or
# climbing, faster or slower than another setting), and every notebook checks the shapes it talks
# about on your own run, in lines like these:
#
# - `✓ on your run: …` the sentence holds on the numbers you just measured, which it quotes;
# - `✗ not on your run: … — …` it does not, followed by what to look at and why that can happen.
#
# A ✗ is not an error: a busy machine, a GPU or other settings can change a shape, and the line
# says how.

# %%
import pandas as pd
from kvlab.env import environment

env = environment()
pd.Series({"device": env["device"], "CPU cores": env["cpu_count"], "torch threads": env.get("torch_threads"),
           "GPU": env.get("cuda_device") or "none", "python": env["python"],
           **{f"{name} version": version for name, version in env["versions"].items()}}).to_frame("this machine")

# %% [markdown]
# ## 2. How the lab is laid out
#
# The notebooks are meant to be done in order; each one links to the next at the bottom. The table
# is made from the course's own list (`kvlab.course.NOTEBOOKS`), the same one the README's
# [course map](../README.md#course-map) shows; *minutes* is what to plan for reading, running, trying
# the knobs and the exercises. How long each notebook takes to run top to bottom is in that course
# map, which `python -m kvlab notebooks` rewrites after every build: a table saved in this notebook's
# outputs would go stale as soon as another notebook is rebuilt.

# %%
from IPython.display import Markdown
from kvlab.course import course_map

Markdown(course_map(link_prefix="", run_times=False))

# %% [markdown]
# Under the notebooks sits the `kvlab` package, in layers. Each layer uses only the ones below it,
# so when a figure surprises you, you can follow it down: the panel calls an experiment, the
# experiment calls `kvlab.generate`, which calls the model with a cache.
#
# ```
# notebooks/          what you are reading: a few lines, one experiment behind a button, plots
# kvlab.lessons       one folder per notebook (l01_the_slowdown/ ...): its experiments, each returning
#                     a pandas DataFrame, its figures, its panel (controls, a Run button, a progress
#                     bar), the claims checked on your run and the exercises' checkers
# kvlab.generate      timed generation: a prefill, then one decode step per token
# kvlab.model         the decoder (Llama and GPT-2 families)
# kvlab.cache         the KV cache strategies: none, dynamic, static, quantized, offloaded
# ```

# %% [markdown]
# ## 3. Your first panel
#
# A panel is a few controls, a **Run** button, a progress bar and an output area. This one asks the
# lesson model (about 3 million parameters, random weights: timing does not need a trained model)
# to write 100 tokens **with** a KV cache, three times over, and plots how long each token took
# (the fastest of the three runs).
#
# First, a prediction. The first step, the *prefill*, pushes every token of the prompt (the panel's
# *prompt tokens*) through the model in one pass; each later step pushes only the newest token. Type
# in the box how many times as long as one of those one-token steps you expect the prefill to take,
# then press **Run**.

# %%
from kvlab.lessons.common.predict import predict

guess = predict("How many times as long as a one-token decode step will the prefill step take?", unit="×")
guess

# %%
from kvlab.lessons.l01_the_slowdown.panel import slowdown_panel

panel = slowdown_panel(caches=("dynamic",), max_new_tokens=100, title="Time every token of one generation")
panel

# %% [markdown]
# Pressing **Run** and calling `panel.run()` do the same thing. The call hands back the result,
# so the cell below also leaves a picture in the saved notebook for anyone reading it without
# running it:

# %%
result = panel.run()
result.show()

# %% [markdown]
# Every figure of the lab is drawn from a plain DataFrame, one row per generated token here.
# `time_s` is the clock a user feels: when each token arrived after the request started.

# %%
result.frame.head()

# %% [markdown]
# ### Try it
#
# - Press **Run** again without changing anything. The status line says the result came from the
#   cache: the same settings are never measured twice. Move a slider away and back: same.
# - Call `panel.run(prompt_tokens=1000)`. The panel refuses in one line that names the bad value and
#   says what to do instead. Every error in kvlab is written that way; none should ever show you a
#   wall of traceback.
# - Set *repeats* to 1 and run. A jagged line on the left means other programs were competing for
#   the CPU during the run; taking the fastest of several runs filters most of that out.
#
# ### The first token and the others
#
# Compare `step_ms` of token 0 with the tokens after it. Token 0 is the *prefill*: it read all
# 32 prompt tokens in one step. Did it take 32 times as long as a one-token step? Your prediction
# beside your run (the prefill's time over the median decode step's, each the fastest of the runs):

# %%
from kvlab.lessons.l01_the_slowdown.slowdown import prefill_vs_decode

guess.against(prefill_vs_decode(result.frame)["ratio"])

# %% [markdown]
# The next cell checks on your numbers what that says about the cost of one token:

# %%
from kvlab.lessons import verdicts

verdicts(result, "prefill_costs_less_per_token_than_decode", after=guess)

# %% [markdown]
# Processing tokens side by side in one pass costs far less per token than writing them one at a
# time, which is why the wait for the first token and the pace of the following ones are
# different clocks (notebook 04), and why the slowdown of notebook 01 is milder than its work.

# %% [markdown]
# <!-- kvlab:exercise check_prefill_and_decode -->

# %% [markdown]
# <!-- kvlab:exercise check_comparing_machines -->

# %% [markdown]
# ## 4. Running the lab elsewhere
#
# - **Locally**: the README's quick start is two commands; the first opens JupyterLab on this notebook.
# - **Binder** (badge at the top): a CPU-only JupyterLab in your browser, nothing to install. The first
#   start can take a few minutes while the image builds; a session ends after a few idle minutes,
#   so download anything you change.
# - **Colab** (badge at the top): the first cell installs kvlab from the project's repository. For a
#   GPU choose *Runtime > Change runtime type*. Every notebook also runs on a CPU.
# - To force a device, set `KVLAB_DEVICE=cpu` (or `cuda`) before starting Jupyter.
#
# ## Summary
#
# - Your numbers belong to your machine: the device, versions and threads above go with every result.
# - Each notebook says which clock its times come from: your wall clock, a virtual clock with fixed
#   step costs, or (06) a simulator calibrated on a real machine; each measured sentence is checked
#   on your own run (✓ or ✗).
# - The lab is a sequence of short notebooks over one small package, in layers you can read.
# - A panel runs one experiment: settings, **Run**, a progress bar, a figure and its DataFrame;
#   results are kept per setting, and mistakes come back as one clear line.

# %% [markdown]
# <!-- kvlab:navigation -->
