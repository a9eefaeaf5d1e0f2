# %% [markdown]
# <!-- kvlab:header -->
# kvlab asks one question: **why can an AI service that is fast on paper still keep a person
# waiting?** Each notebook runs an experiment on one part of it and checks what it says on your
# run. Every time comes from one of three clocks, and each notebook says which:
#
# - **your wall clock**: a real (small) model runs on your machine and is timed;
# - **a virtual clock**: each step is priced at a fixed cost, so the times are the same on every machine;
# - **a simulator** (notebook 06): steps priced by a cost model fitted to timings of the real model.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - say which machine and which clock a number comes from;
# - read the ✓/✗ line that checks a sentence on your run;
# - drive a **panel**: settings, **Run**, a figure and its table.

# %% [markdown]
# ## 1. Your machine
#
# Every measured time depends on these lines: compare them before comparing times with a neighbour.
# The lessons are about the **shape** of a result (flat or climbing), and each notebook checks its
# shapes on your run: `✓ on your run: …` when the sentence holds there, `✗ not on your run: …` when
# it does not, saying why that can happen (a busy machine, a GPU). A ✗ is not an error.

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
# Do the notebooks in order; each links to the next at the bottom. *Minutes* is the time to plan for
# reading, running and the exercises.

# %%
from IPython.display import Markdown
from kvlab.course import course_map

Markdown(course_map(link_prefix="", run_times=False))

# %% [markdown]
# ### Going deeper: the package under the notebooks
#
# The table is made from the course's own list (`kvlab.course.NOTEBOOKS`), the same one the README's
# [course map](../README.md#course-map) shows; that map also gives how long each notebook takes to run,
# rewritten by `python -m kvlab notebooks` after every build.
#
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
#
# The serving notebooks also replay requests on the virtual clock: the scheduler's decisions are the
# real ones, and every timestamp can be worked out by hand. *Under load* (06) needs hundreds of
# requests at many loads, which the real model would take many minutes to serve, so there the engine
# prices each step with a cost model fitted to the real model's timings; its big sweeps use a cost
# model fitted on the authors' machine, and the notebook checks one fitted on yours against the real
# model.

# %% [markdown]
# ## 3. Your first panel
#
# A panel is a few controls, a **Run** button and an output area. This one has a small model (random
# weights: timing needs no training) write 100 tokens **with** a KV cache, three times, timing each.
#
# First, predict. The first step, the *prefill*, pushes the whole prompt (32 tokens on a CPU) through the
# model in one pass; each later step pushes only the newest token. How many times as long as a
# one-token step will the prefill take? Type your number, then run the next cells.

# %%
from kvlab.lessons.common.predict import predict

guess = predict("How many times as long as a one-token decode step will the prefill step take?", unit="×")
guess

# %%
from kvlab.lessons.l01_the_slowdown.panel import slowdown_panel

panel = slowdown_panel(caches=("dynamic",), max_new_tokens=100,
                       title="Time every token of one generation").folded_until(guess)  # it answers the question
panel

# %% [markdown]
# Pressing **Run** and calling `panel.run()` do the same; the figure stays folded until you predict.

# %%
result = panel.run()
display(guess.fold(result, what="this run's figure"))

# %% [markdown]
# ### The first token and the others
#
# Your prediction beside your run: the prefill's time over the median one-token step (each the
# fastest of the three runs).

# %%
from kvlab.experiments.slowdown import prefill_over_decode

guess.against(result, prefill_over_decode)

# %% [markdown]
# Every figure is drawn from a DataFrame, one row per token here; token 0 is the prefill.

# %%
from kvlab.lessons import verdicts

display(result.frame.head())
verdicts(result, "prefill_costs_less_per_token_than_decode", after=guess)

# %% [markdown]
# Tokens processed side by side in one pass cost far less each than tokens written one at a time:
# the first token and the later ones run on different clocks (notebook 04).
#
# ### Try it
#
# - Call `panel.run(prompt_tokens=1000)`: the panel refuses in one line that says what to do.
# - Set *repeats* to 1: a jagged line means other programs competed for the CPU.

# %% [markdown]
# <!-- kvlab:exercise check_prefill_and_decode -->

# %% [markdown]
# <!-- kvlab:exercise check_comparing_machines -->

# %% [markdown]
# ## 4. Running the lab elsewhere
#
# - **Locally**: the README's quick start, two commands.
# - **Binder** (badge at the top): a CPU in your browser. [A session ends after 10 idle
#   minutes](https://mybinder.readthedocs.io/en/latest/about/user-guidelines.html): download what you change.
# - **Colab** (badge at the top): for a GPU, [*Runtime > Change runtime type*](https://research.google.com/colaboratory/faq.html).
#
# ## Summary
#
# - Your numbers belong to your machine: quote the setup report with them.
# - Each time comes from a named clock; each measured sentence is checked on your run.

# %% [markdown]
# <!-- kvlab:navigation -->
