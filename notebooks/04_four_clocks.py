# %% [markdown]
# <!-- kvlab:header -->
# A service can answer quickly on average and still leave one person staring at an empty screen.
# Whether it is "fast" depends on which clock you look at: when the answer starts, how steadily
# it flows, when it is complete, and how much the whole service produces. This notebook follows
# one request through a busy serving engine and reads all four clocks off its timeline.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - name the four clocks and say what each one does **not** tell you;
# - read a request's journey: arrival, queue, admission, prefill, first token, every later token, finish;
# - compute TTFT, TPOT and E2E from a request's timestamps (and predict them from the steps it
#   waited for), and say why TPOT divides by *n − 1*;
# - tell a cold start from a warm one, and measure both instead of guessing;
# - explain why a mean latency can look fine while some requests wait far longer, and report quantiles with their sample size;
# - say what a tokenizer counts: tokens per word by language, and why tokens/s does not compare across tokenizers.

# %% [markdown]
# ## Four clocks
#
# Every clock here starts when the request was **scheduled to arrive**, the moment its user pressed
# enter. Starting later (say, when the server first looked at it) would quietly drop the time it
# spent waiting in line.
#
# | clock | the question it answers | what it leaves out |
# |---|---|---|
# | **TTFT**, time to first token | when does the answer start to appear? | how long the rest takes |
# | **time between tokens**: TPOT per request = (E2E − TTFT) / (n − 1); the gaps themselves (ITL) | does the text flow steadily? | the wait before it started |
# | **E2E**, end to end | when is the whole answer there? | how much of that is just a long answer |
# | **throughput**, output tokens per second of the whole service | how much work gets done? | what any one person waited |
#
# The first three belong to one request; throughput belongs to the service. Most arguments about
# "speed" are two people quoting different rows of this table.

# %% [markdown]
# ## The engine and the model
#
# The lesson model of notebook 01 (about 3 million parameters, random weights: the timing is that of
# a real model of this shape). The engine in `kvlab.serving` batches many requests over one paged
# KV cache, the way vLLM does; notebooks 05 and 07 open it up. Here it is a black box that stamps
# the time of every event of every request.

# %%
# %matplotlib inline
from kvlab.runs.serving_run import lesson_model

model = lesson_model()
print(f"{model.config.name}: {model.num_parameters() / 1e6:.1f}M parameters, context of "
      f"{model.config.max_position_embeddings} tokens")

# %% [markdown]
# ## One request's journey
#
# A few long requests arrive first; the engine has only two batch slots (`max_seqs`), so our
# request (the *watched* one) arrives just after them and has to wait. Press **Run**, then move the
# sliders: more requests ahead, more slots, a longer prompt.

# %%
from kvlab.lessons.l04_four_clocks.panel import journey_panel

panel = journey_panel(model)
panel

# %%
result = panel.run()   # the same as pressing Run
result.show()

# %% [markdown]
# **Reading the figure.** The grey bar is the queue: the request has arrived (▼) but no slot
# is free. When a slot frees it is admitted (●) and its prompt is computed in one step (orange),
# which produces the first token (★): TTFT is the whole span from ▼ to ★. How much of it was
# queue, not computation, on your run:

# %%
from kvlab.lessons import verdicts

verdicts(result, "watched_ttft_is_mostly_queue")

# %% [markdown]
# Then one token per step (blue, each tick a token) until the last (■). The lower panel shows
# each gap between tokens: their mean is TPOT. A gap is one engine step, so it grows when that
# step also carries other requests' work (another prompt's prefill, most of all) or when the
# machine is busy with something else. With the default sliders the requests ahead are done by the
# time the watched one decodes, so it has its steps to itself; give the engine 3 slots to see it
# share them.
#
# Who was it waiting behind? The same run as a Gantt chart, one row per request:

# %%
from kvlab.lessons.common.gantt import plot_gantt

plot_gantt(result.frame, result.frame.attrs["steps"], title="The journey run: every request")

# %% [markdown]
# ## The same journey, worked out by hand
#
# Real timings change from run to run. To check the arithmetic, the cell below serves the same
# requests with a **fixed step-cost executor**: the engine's real scheduler and block manager
# decide every step, but each step is priced at exactly `STEP_S` seconds instead of running the
# model, on a virtual clock. Now every timestamp can be predicted by hand: a request that decodes
# in every step gets one token per step, so its TPOT must be exactly one step, and its TTFT is the
# number of steps that ran before its first token came out, times `STEP_S`, minus its arrival time.

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.clocks import summarize
from kvlab.lessons.l04_four_clocks.four_clocks import journey_clocks, run_journey
from kvlab.runs.serving_run import FixedStepCostExecutor

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
# The last line is the other half of honest reporting: at any cut-off, every request sent is
# either completed, failed, still waiting or still running. A latency figure computed over the
# completed ones only says nothing about the others, so the counts go next to it.

# %% [markdown]
# <!-- kvlab:exercise check_step_cost_clocks -->

# %% [markdown]
# ## Cold start vs warm start
#
# The very first request a service gets after starting can wait for things that have nothing to do
# with it: the interpreter starting, libraries importing, weights loading, the KV pool being
# allocated, the first forward pass setting things up. This notebook's own process paid those costs
# long ago, so measuring them here would be dishonest. The cell below starts a **fresh Python
# process**, times each start-up phase, then serves the same single request five times in a row.

# %%
from kvlab.lessons.l04_four_clocks.four_clocks import cold_vs_warm, cold_warm_summary, startup_phases
from kvlab.lessons.l04_four_clocks.figures_startup import plot_cold_warm

cold = cold_vs_warm(repeats=5)
display(startup_phases(cold).round(3))
display(cold_warm_summary(cold).round(3))
plot_cold_warm(cold)

# %%
verdicts(cold, "startup_dwarfs_a_warm_request", "first_request_extra_is_small")

# %% [markdown]
# **What the measurement says.** The big cost of a cold start is everything *before* the request:
# the first verdict compares it, phase by phase, with a warm request's TTFT on your machine. The
# first serving (run 0) may pay some extra of its own; the second verdict puts that extra next to
# the spread of the warm servings and next to the start-up. With only a few warm servings, a
# difference of the size of their spread is noise. With real weights loaded from disk, and on a GPU (where the first
# calls also create the device context and load kernels), the start-up phases grow further. So a
# benchmark must say whether it measured a cold or a warm service, and a service that scales down
# to zero should expect some users to meet the cold one.
#
# ## Why a mean hides the wait
#
# Now thirty requests of mixed lengths (chat turns, long documents, long generations) arrive at
# random, six per second on average but in clumps, as real traffic often does (`burstiness=0.1`:
# most gaps between arrivals are near zero, a few are long), with two batch slots. A request that
# arrives while a slot is free is admitted at the next step, and its TTFT is just its prefill:
# short for a chat turn, longer for a long document. One that arrives in a clump waits in the queue
# until the requests ahead of it finish, and that wait comes on top of its prefill.

# %%
from kvlab.lessons.l04_four_clocks.four_clocks import mean_vs_tail, run_mixed_load
from kvlab.lessons.l04_four_clocks.figures_distribution import plot_clock_distribution

mixed = run_mixed_load(model)
display(mean_vs_tail(mixed.requests).round(3))
plot_clock_distribution(mixed.requests, "ttft_s")

# %%
verdicts(mixed, "share_waiting_longer_than_the_mean", "ttft_tail_is_well_above_the_mean")

# %% [markdown]
# **Reading the figure.** The requests that found a free slot pile up on the left (on a quiet
# machine often in two humps, short prompts' prefills and long ones'); those that queued in a
# clump make the thin tail to the right. A few long waits pull the mean above the median, and yet the mean stays
# far below what the slowest requests experienced: the verdicts above say how far on your run. A
# dashboard showing only the mean would call such a service fine. Always quote a few quantiles (p50, p95, p99), and always
# with **n**: with n = 30, the p99 lies between the two slowest requests, so it is a hint, not a
# law; run the cell again and watch it move. (If every request waited long here, your machine is
# slower than the lesson assumes and the service is overloaded: try `run_mixed_load(model, rate=3)`.)

# %% [markdown]
# <!-- kvlab:exercise check_share_above_mean -->

# %% [markdown]
# ## Tokens are not words
#
# Throughput is counted in tokens per second, and TPOT in seconds per token. A reader gets words,
# and how many tokens a word costs depends on the **tokenizer** and on the **language**. Two models
# with different tokenizers can write the same text at the same pace and report very different
# tokens/s.
#
# kvlab ships one short paragraph written in English and translated into ten languages, a few lines
# of Python and a line of numbers (`kvlab/data/texts/samples.json`). Three tokenizers read them:
#
# - **kvlab's byte tokenizer**, the one the lesson model uses: one token per UTF-8 byte;
# - a **BPE tokenizer trained right here**, offline, with the `tokenizers` library, on a small English
#   corpus kvlab ships (`kvlab/data/texts/english_corpus.txt`, which does not contain the paragraph).
#   BPE starts from the 256 bytes and keeps merging the most frequent neighbouring pair into a new
#   token: it learns English words and pieces of words, and nothing of other scripts;
# - a **real model's tokenizer** (SmolLM2-135M's) where this machine can reach the Hugging Face hub or
#   has it in its cache; otherwise the cell says so in one line and the comparison keeps the other two.
#
# Below, each tokenizer cuts the first sentence of three texts: `␣` is a space, and a character
# cut into several tokens (its UTF-8 bytes, when the tokenizer never learned it whole) is shown once,
# with the number of tokens it took as an exponent.

# %%
from kvlab.lessons.l04_four_clocks.tokens_words import first_sentences, lesson_tokenizers

toks, note = lesson_tokenizers()   # trains the BPE (milliseconds); looks for the real one (a few seconds at most)
print(note)
for name, tok in toks.items():
    print(f"{name:16s} {tok!r}")
print()
for row in first_sentences(toks).itertuples():
    print(f"{row.text:8s} {row.tokenizer:16s} {row.tokens:3d} tokens  {row.pieces}")

# %% [markdown]
# **Predict first.** The Chinese paragraph says what the English one says in far fewer characters.
# Type in the box how many times as many tokens as the English paragraph the English-trained BPE will
# spend on it, then run the next cells.

# %%
from kvlab.lessons.common.predict import predict

guess = predict("For the same paragraph, how many times as many tokens will the English-trained BPE spend on "
                "the Chinese version as on the English one?", unit="×")
guess

# %%
from kvlab.lessons.l04_four_clocks.tokens_words import count_tokens, tokens_table, vs_english

counts = count_tokens(toks)
guess.fold(tokens_table(counts).round(2))

# %%
# NBVAL_CHECK_OUTPUT
guess.against(vs_english(counts, "Chinese"), what="the BPE spent")

# %% [markdown]
# In the table, **words** are what spaces separate; Chinese and Japanese put no spaces between words,
# so they have no tokens per word: compare them in the **vs_english** column, the tokens each
# translation costs for the same content, as a multiple of the English paragraph's (with the same
# tokenizer).

# %%
# NBVAL_CHECK_OUTPUT
verdicts(counts, "byte_tokens_are_utf8_bytes", "english_bpe_favours_english", after=guess)

# %% [markdown]
# **Why.** Bytes treat every language alike, byte for byte, so a script whose characters take more
# bytes costs more tokens, and Chinese, with few characters, can even come out cheaper than English.
# The BPE turned its vocabulary into English words: English gets much cheaper, the languages that share
# its alphabet a little, and wherever it never saw a script it falls back to bytes, token for token.
# Real tokenizers are trained on far larger and more varied text, with vocabularies of tens of
# thousands of tokens, but the same holds for them: what their training mix holds little of costs more
# tokens. Where a real tokenizer's columns are shown above, check it for yourself.
#
# ### What it does to tokens/s
#
# Now let every model write every language at the same pace for a reader: `WORDS_PER_S` words per
# second, counted in the words of the English version, so every language carries the same content per
# second. The tokens/s each tokenizer counts for that same text:

# %%
from kvlab.lessons.l04_four_clocks.tokens_words import tokens_per_second
from kvlab.lessons.l04_four_clocks.figures_tokens import plot_tokens_per_word

WORDS_PER_S = 10   # the pace a reader gets (a setting: change it)
rates = tokens_per_second(counts, words_per_s=WORDS_PER_S)
plot_tokens_per_word(counts, rates)

# %%
# NBVAL_CHECK_OUTPUT
verdicts(rates, "same_words_different_tokens_per_second")

# %% [markdown]
# Turn it around, as when reading two benchmark reports. Model A uses kvlab's byte tokenizer and
# reports more tokens per second than model B, which uses the BPE (the figures are settings: change
# them). Which one writes English faster?

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.lessons.l04_four_clocks.tokens_words import BPE, BYTE, words_per_second

reported = {BYTE: 50, BPE: 20}   # tokens/s, as two benchmark reports would give them
words = words_per_second(counts, reported)
display(words.round(2))
verdicts(words, "fewer_tokens_per_second_can_be_more_words")

# %% [markdown]
# So tokens/s compares two runs of **the same model and tokenizer** on the same kind of text. Across
# models, or across languages, convert to words (or characters, or bytes) with that model's own
# tokenizer on your own text, or compare the time to a finished answer (E2E) instead. The same goes for
# TPOT, and for the price of a service billed per token.

# %% [markdown]
# ### Try it
#
# - In the panel, set **batch slots** to 8: the queue disappears. What happens to TTFT, and to TPOT?
# - Set **long requests ahead** to 0 and the prompt to 512 tokens: now TTFT is mostly prefill, not queue.
# - Run `run_mixed_load(model, rate=12)`: twice the arrival rate. Which grows faster, the p50 or the p95?
# - Run `run_mixed_load(model, burstiness=4.0)`: the same rate, evenly spaced. What happens to the tail?
# - Run `run_mixed_load(model, max_seqs=4)`: twice the batch slots for the same clumps. Which quantiles move?
# - In the exact run, change `STEP_S` to 0.020 and predict every clock before running the cell.
# - Train the BPE with a smaller vocabulary, `lesson_tokenizers(real=None, bpe=train_bpe(vocab_size=300))`
#   (`from kvlab.lessons.l04_four_clocks.tokens_words import train_bpe`): what happens to English's tokens per word?
# - Train it on English plus one translation (`train_bpe(corpus=training_corpus() + text)`, with `text` taken
#   from `load_samples()`): which columns move? (That paragraph is then no longer held out.)
# - Online, compare a tokenizer trained on many languages: `lesson_tokenizers("Qwen/Qwen2.5-0.5B")`.
#
# ## Summary
#
# - TTFT, time between tokens, E2E and throughput answer different questions; a single number
#   answers one of them at most. Each request clock starts at the scheduled arrival.
# - A request's TTFT can be mostly queueing: the model was fast, the line was long.
# - TPOT = (E2E − TTFT) / (n − 1): the mean gap after the first token. The largest gap is what a reader notices.
# - A cold start pays start-up costs before the first request, many times a warm request's TTFT.
#   Say which one a number measured.
# - Latency distributions have tails: report p50, p95, p99 with n, and the counts of completed,
#   failed, waiting and running requests.
# - Tokens are not words: the same text costs different numbers of tokens with different tokenizers and
#   in different languages, so tokens/s compares runs of one model only; across models, count words.
# - Behind this notebook: `kvlab.lessons.l04_four_clocks.four_clocks` (`run_journey`, `journey_clocks`,
#   `cold_vs_warm`, `run_mixed_load`, `mean_vs_tail`), `kvlab.lessons.l04_four_clocks.tokens_words` (`train_bpe`,
#   `count_tokens`, `tokens_per_second`, `words_per_second`), `kvlab.clocks`, `kvlab.lessons.l04_four_clocks.figures_journey`,
#   `kvlab.lessons.common.gantt`, `kvlab.lessons.l04_four_clocks.figures_tokens`; the claims checked on your runs in
#   `kvlab.lessons.l04_four_clocks.claims`; tests in `tests/test_experiments_serving.py`, `tests/test_plots_serving.py`,
#   `tests/test_tokens_words.py` and `tests/test_claims_04.py`.

# %% [markdown]
# <!-- kvlab:navigation -->
