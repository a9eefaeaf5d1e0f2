# %% [markdown]
# <!-- kvlab:header -->
# A service can be fast on average and still leave one person staring at an empty screen. "Fast"
# depends on the clock you read. This notebook follows one request through a busy engine and reads
# four clocks off its timeline.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - name the four clocks and what each one leaves out;
# - compute TTFT, TPOT and E2E from a request's timestamps;
# - explain why a mean latency can look fine while some requests wait far longer;
# - say why tokens/s does not compare across tokenizers.

# %% [markdown]
# ## Four clocks
#
# Every request clock starts when the user pressed enter: the request's **scheduled arrival**.
#
# | clock | answers | leaves out |
# |---|---|---|
# | **TTFT**, time to first token | when does the answer start? | how long the rest takes |
# | **TPOT**, time per output token = (E2E − TTFT) / (n − 1) | how fast does the text flow, on average? | the wait before it started, and the longest pause between tokens |
# | **E2E**, end to end | when is the whole answer there? | how much is just a long answer |
# | **throughput**, output tokens per second of the service | how much work gets done? | what any one person waited |
#
# The first three belong to one request, throughput to the whole service. Most arguments about
# "speed" are two people quoting different rows.

# %%
# %matplotlib inline
from kvlab.experiments.serving_run import lesson_model

model = lesson_model()
print(f"{model.config.name}: {model.num_parameters() / 1e6:.1f}M parameters, context of "
      f"{model.config.max_position_embeddings} tokens")

# %% [markdown]
# ## One request's journey
#
# The lesson model from notebook 01 runs in kvlab's engine, which batches requests over a paged KV
# cache as [vLLM does](https://arxiv.org/abs/2309.06180). A few long requests arrive first; the
# engine has two batch slots, so our *watched* request must wait. Press **Run**, then move the sliders.

# %%
from kvlab.lessons.l04_four_clocks.panel import journey_panel

panel = journey_panel(model)
panel

# %%
result = panel.run()   # the same as pressing Run
result.show()

# %% [markdown]
# **Reading the figure.** Grey is the queue: the request has arrived (▼) but no slot is free.
# Once admitted (●), its prompt is computed in one step (orange), which gives the first token (★).
# TTFT is the whole span from ▼ to ★:

# %%
from kvlab.lessons import verdicts

verdicts(result, "watched_ttft_is_mostly_queue")

# %% [markdown]
# Then one token per step (blue ticks) until the last (■). The lower panel shows the gaps between
# tokens; their mean is TPOT, but only the gaps themselves (their p95, the largest) show whether the
# text flowed steadily. A gap grows when the step also carries other requests' work. Who was
# our request waiting behind? One row per request:

# %%
from kvlab.lessons.common.gantt import plot_gantt

plot_gantt(result.frame, result.frame.attrs["steps"], title="The journey run: every request")

# %% [markdown]
# ## The same journey, worked out by hand
#
# Real timings jitter. Below, the engine's real scheduler decides every step, but each step costs
# exactly `STEP_S` on a virtual clock. Now you can predict every clock: TTFT = (steps until the first
# token) × `STEP_S` − arrival, and TPOT is one step.

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.clocks import summarize
from kvlab.experiments.four_clocks import journey_clocks, run_journey
from kvlab.experiments.serving_run import FixedStepCostExecutor

STEP_S = 0.010
exact = run_journey(model, executor=FixedStepCostExecutor(step_s=STEP_S), clock="virtual")
r = exact.record(exact.extra["watched"])
mine = exact.steps[exact.steps["request_id"] == r.request_id]
first_step = int(mine["step"].min())
first_token_step = int(mine.loc[mine["phase"] == "prefill", "step"].max())
n = r.output_tokens
print(f"watched request: arrives {r.scheduled_s:.3f} s, admitted in step {first_step}, first token from step "
      f"{first_token_step}, {n} tokens")
c = r.clocks()
hand_ttft = (first_token_step + 1) * STEP_S - r.scheduled_s
hand_e2e = hand_ttft + (n - 1) * STEP_S
print(f"TTFT  by hand: ({first_token_step} + 1) steps x 10 ms - {r.scheduled_s * 1e3:.0f} ms = "
      f"{hand_ttft * 1e3:.0f} ms   engine: {c['ttft_s'] * 1e3:.0f} ms")
print(f"TPOT  by hand: one step = {STEP_S * 1e3:.0f} ms   engine: {c['tpot_s'] * 1e3:.0f} ms")
print(f"E2E   by hand: TTFT + {n - 1} steps x 10 ms = {hand_e2e * 1e3:.0f} ms   engine: {c['e2e_s'] * 1e3:.0f} ms")
cut = summarize(exact.records, until_s=0.5)
print(f"at t = 0.5 s: sent {cut.sent} = completed {cut.completed} + failed {cut.failed} + "
      f"waiting {cut.waiting} + running {cut.running}")
verdicts(exact, "watched_clocks_follow_from_its_steps")

# %% [markdown]
# The last printed line matters too: at any moment, every request sent is completed, failed, waiting
# or running. A latency over the completed ones says nothing about the rest, so report the counts.

# %% [markdown]
# <!-- kvlab:exercise check_step_cost_clocks -->

# %% [markdown]
# ## Why a mean hides the wait
#
# Now thirty requests of mixed lengths arrive at random, in clumps, as real traffic often does, with
# two batch slots. A request that finds a free slot waits only for its own prefill. One that arrives
# in a clump queues behind the others first.

# %%
from kvlab.experiments.four_clocks import mean_vs_tail, run_mixed_load
from kvlab.lessons.l04_four_clocks.figures import plot_clock_distribution

mixed = run_mixed_load(model)
display(mean_vs_tail(mixed.requests).round(3))
plot_clock_distribution(mixed.requests, "ttft_s")

# %%
verdicts(mixed, "share_waiting_longer_than_the_mean", "ttft_tail_is_well_above_the_mean")

# %% [markdown]
# **Reading the figure.** Requests that found a slot pile up on the left; those caught in a clump
# make the thin tail on the right. The tail pulls the mean above the median, yet the mean stays far
# below what the slowest waited. A dashboard showing only the mean would call this service fine.
# Quote p50, p95 and p99, always with **n**: with n = 30 the p99 sits between the two slowest
# requests, a hint rather than a law. Run the cell again and watch it move.

# %% [markdown]
# <!-- kvlab:exercise check_share_above_mean -->

# %% [markdown]
# ### Going deeper: cold start vs warm start, in a fresh process
#
# The first request after a service starts can wait for things that have nothing to do with it: the
# interpreter starting, libraries importing, weights loading, the KV pool being allocated, the first
# forward pass setting things up. This notebook's own process paid those costs long ago, so the cell
# below starts a **fresh Python process**, times each start-up phase, then serves the same single
# request a dozen times in a row (run 0 is the cold one).

# %%
from kvlab.experiments.four_clocks import cold_vs_warm, cold_warm_summary, startup_phases
from kvlab.lessons.l04_four_clocks.figures import plot_cold_warm

cold = cold_vs_warm(repeats=12)
display(startup_phases(cold).round(3))
display(cold_warm_summary(cold).round(3))
plot_cold_warm(cold)

# %%
verdicts(cold, "startup_dwarfs_a_warm_request", "first_request_extra_is_small", fold=True)

# %% [markdown]
# Each check compares like with like: the start-up with the whole warm service (every warm request,
# start to finish), and the first request with the warm ones beside their own spread.
# The start-up is one measurement of one process: run the cell again to see how much it moves (a
# second start usually finds the libraries in the operating system's file cache and is quicker).
#
# With real weights read from disk the model phase grows with the model. On a GPU the first calls
# also create the device context and load kernels on first use
# ([CUDA lazy loading](https://docs.nvidia.com/cuda/cuda-programming-guide/04-special-topics/lazy-loading.html)),
# so there the first request itself can pay a visible extra: that is what a warm-up request before
# opening a service is for. A benchmark must say whether it measured a cold or a warm service, and a
# service that scales down to zero should expect some users to meet the cold one.

# %% [markdown]
# ## Tokens are not words
#
# Throughput counts tokens per second. A reader gets words, and how many tokens a word costs depends
# on the **tokenizer** and the **language**. kvlab ships one paragraph in English and ten translations.
# Two tokenizers read them: kvlab's byte tokenizer (one token per UTF-8 byte, the lesson model's), and
# a **BPE** trained here on a small English text: it merges frequent byte pairs into words and word
# pieces it has seen, and falls back to bytes for anything else.

# %%
from kvlab.lessons.common.predict import predict

guess = predict("For the same paragraph, how many times as many tokens will the English-trained BPE spend on "
                "the Chinese version as on the English one?", unit="×")
guess

# %%
from kvlab.experiments.tokens_words import count_tokens, lesson_tokenizers, tokens_table

toks, note = lesson_tokenizers()   # trains the BPE (milliseconds); looks for a real model's one (seconds at most)
print(note)
counts = count_tokens(toks)
guess.fold(tokens_table(counts).round(2))

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.experiments.tokens_words import chinese_vs_english

guess.against(counts, chinese_vs_english, what="the BPE spent")

# %%
# NBVAL_CHECK_OUTPUT
verdicts(counts, "byte_tokens_are_utf8_bytes", "english_bpe_favours_english", after=guess, fold=True)

# %% [markdown]
# **Why.** Bytes treat every language alike, byte for byte: a script whose characters take more
# bytes costs more tokens. The BPE learned English words, so English got much cheaper and every
# script it never saw fell back to bytes. Real tokenizers learn from far more varied text, but the same
# holds: what their training held little of costs more tokens. So tokens/s compares two runs of **one
# model and tokenizer**; across models, compare words per second or the time to a finished answer.

# %% [markdown]
# ### Going deeper: how each tokenizer cuts a sentence, and what it does to tokens/s
#
# Each tokenizer cuts the first sentence of three texts: `␣` is a space, and a character cut into
# several tokens (its UTF-8 bytes) is shown once, with the number of tokens as an exponent. A real
# model's tokenizer (SmolLM2-135M's) joins the table where this machine can reach the Hugging Face hub
# or has it cached. Words are what spaces separate, so Chinese and Japanese have no tokens per word:
# compare them in the **vs_english** column.

# %%
from kvlab.experiments.tokens_words import first_sentences

for name, tok in toks.items():
    print(f"{name:16s} {tok!r}")
print()
for row in first_sentences(toks).itertuples():
    print(f"{row.text:8s} {row.tokenizer:16s} {row.tokens:3d} tokens  {row.pieces}")

# %% [markdown]
# Now let every model write every language at the same pace, `WORDS_PER_S` words per second
# (counted in the English version's words, so every language carries the same content per second).
# The tokens/s each tokenizer counts for that same text:

# %%
from kvlab.experiments.tokens_words import tokens_per_second
from kvlab.lessons.l04_four_clocks.figures import plot_tokens_per_word

WORDS_PER_S = 10   # the pace a reader gets (a setting: change it)
rates = tokens_per_second(counts, words_per_s=WORDS_PER_S)
plot_tokens_per_word(counts, rates)

# %%
# NBVAL_CHECK_OUTPUT
verdicts(rates, "same_words_different_tokens_per_second", fold=True)

# %% [markdown]
# Turn it around, as when reading two benchmark reports. Model A uses kvlab's byte tokenizer and
# reports more tokens per second than model B, which uses the BPE (the figures are settings: change
# them). Which one writes English faster?

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.experiments.tokens_words import BPE, BYTE, words_per_second

reported = {BYTE: 50, BPE: 20}   # tokens/s, as two benchmark reports would give them
words = words_per_second(counts, reported)
display(words.round(2))
verdicts(words, "fewer_tokens_per_second_can_be_more_words", fold=True)

# %% [markdown]
# The same goes for TPOT, and for the price of a service billed per token.

# %% [markdown]
# ## Try it
#
# - In the panel, set **batch slots** to 8: the queue disappears. What happens to TTFT, and to TPOT?
# - Run `run_mixed_load(model, rate=12)`, twice the arrival rate. Which grows faster, p50 or p95?
# - Run `run_mixed_load(model, burstiness=4.0)`: the same average rate without the clumps. The gaps
#   between arrivals still vary, half as much (relative to their mean) as for independent, Poisson
#   arrivals: more regular, not evenly spaced. What happens to the tail?
# - In the exact run, set `STEP_S = 0.020` and predict every clock before running the cell.

# %% [markdown]
# ### Going deeper: more to try, and what is behind this notebook
#
# - Set **long requests ahead** to 0 and the prompt to 512 tokens: now TTFT is mostly prefill.
# - `run_mixed_load(model, max_seqs=4)`: twice the slots for the same clumps. Which quantiles move? If
#   every request waited long, your machine is slower than the lesson assumes: try `rate=3`.
# - Train the BPE with a smaller vocabulary, `lesson_tokenizers(real=None, bpe=train_bpe(vocab_size=300))`
#   (`from kvlab.experiments.tokens_words import train_bpe`): what happens to English?
# - Train it on English plus one translation (`train_bpe(corpus=training_corpus() + text)`, with `text`
#   from `load_samples()`): which columns move?
# - Online, a tokenizer trained on many languages: `lesson_tokenizers("Qwen/Qwen2.5-0.5B")`.
#
# Behind this notebook: `kvlab.experiments.four_clocks` (`run_journey`, `cold_vs_warm`,
# `run_mixed_load`, `mean_vs_tail`), `kvlab.experiments.tokens_words`, `kvlab.clocks` and
# `kvlab.lessons.common.gantt`; the claims checked on your runs in `kvlab.lessons.l04_four_clocks.claims`.

# %% [markdown]
# ## Summary
#
# - TTFT, TPOT, E2E and throughput answer different questions; each request clock starts at arrival.
# - A TTFT can be mostly queue: the model was fast, the line was long.
# - A mean hides the tail: report p50, p95, p99 with n, and count the requests not completed.
# - Tokens are not words: tokens/s compares runs of one model only.

# %% [markdown]
# <!-- kvlab:navigation -->
