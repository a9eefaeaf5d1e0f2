# %% [markdown]
# <!-- kvlab:header -->
# Every clock in the notebooks so far was stamped inside the engine. The person waiting is somewhere
# else: at the other end of a network connection, behind an HTTP server that has to parse the
# request, hand it to the engine, and send each token back as it comes. Their wait starts when they
# press enter and ends when the last token reaches their screen. This notebook measures at that
# end: kvlab's engine runs behind a real HTTP server, and a load generator sends it requests over
# a real socket, just as it would send them to vLLM.

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
# - start an OpenAI-compatible server for kvlab's engine and talk to it like any other server;
# - measure the four clocks **at the client**, starting each one at the request's scheduled arrival;
# - account for every request you sent: completed, rejected by backpressure (HTTP 429), or failed for a stated reason;
# - put client and engine clocks of the same requests side by side, and say what HTTP and streaming add;
# - draw a service curve over the wire and read where the server stops keeping up;
# - explain an achieved rate from the rate actually sent and the window it was measured over;
# - point the same command at a vLLM (or SGLang, TGI, llama.cpp) deployment.
# - measure a second real engine, `transformers serve`, on the same weights and workload, cold and warm, up to its knee.

# %% [markdown]
# ## 1. A server on this machine
#
# `python -m kvlab serve` puts the serving engine of notebooks 05, 07 and 08 behind the HTTP API most
# LLM servers speak, OpenAI's: `POST /v1/completions` and `/v1/chat/completions`, streamed as
# server-sent events. One engine loop batches the requests of every connection. Its waiting queue
# is bounded: when it is full, the server answers **429 Too Many Requests** at once instead of
# letting the line grow without end (*backpressure*).
#
# The cell starts it as a separate process with this notebook's Python, on `127.0.0.1` (only
# this machine can reach it) and a free port. The model is the server's default, recall-tiny, the
# small model shipped inside kvlab and trained only to look up key→value pairs, so the text it
# writes for an ordinary prompt is no language, but the timings are those of real work. The queue is set to 8, deliberately
# small, so that a burst of requests can overflow it. The server is stopped at the end of
# the notebook, and also if the kernel exits before that.

# %%
from kvlab.lessons.l09_measure_a_real_server.wire import start_server

srv = start_server(max_waiting=8)
print("the same in a terminal:  python " + " ".join(srv.cmd[1:]))
print("serving at", srv.url)

# %% [markdown]
# It speaks OpenAI's API, so any client that can talk to OpenAI can talk to it. Here is one
# streamed request, read line by line with a plain HTTP client: each `data:` line is one
# server-sent event carrying one token, then a `usage` event counts the tokens, and `[DONE]`
# closes the stream.

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
# The load generator (`kvlab.http.loadgen`, also `python -m kvlab loadtest`) sends a seeded
# workload **open loop**: each request leaves at its scheduled time whether or not earlier ones
# have been answered, as real users do. Each clock starts at the *scheduled* arrival, so a client
# that falls behind cannot hide a wait; the column `send_delay_s` shows how far behind it fell. A
# token is stamped when its event is read from the socket. Every request asks for `ignore_eos`, so
# it writes exactly its `max_tokens` and we know in advance how many tokens must come back.
#
# 20 short chat-like requests at 16 per second, Poisson arrivals:

# %%
from kvlab.lessons.l09_measure_a_real_server.wire import accounting, measure_at_client

result = measure_at_client(srv.url, num_requests=20, rate=16)
result.summary().latency_frame()   # seconds; n = completed requests behind each quantile

# %% [markdown]
# Before reading any latency, check that every request is accounted for and that the tokens add
# up. The tokens are counted three ways: what the workload asked for, what the server reported
# in `usage`, and how many text events the client actually received.

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
# One row per request, the same `RequestRecord`s and columns as the in-process runs of notebooks
# 04 and 05: the plots and summaries of those notebooks work on these frames unchanged.
#
# ## 3. The same requests, timed at both ends
#
# kvlab's server also keeps the engine's own record of each recent request (`GET /kvlab/requests`),
# stamped from the moment the server received it. The client knows each answer's id, so the two
# records of one request can be joined. At a low, steady rate nothing waits for a batch slot, and
# the difference between the two clocks is the plumbing: sending the request, the server's event
# loop handing it to the engine thread, and streaming the token back.
#
# The two machines' clocks need not agree: the difference is taken per request, between
# *durations* measured on each side.
#
# Predict first: client and server are on this machine, so the request never touches a network.
# By how many milliseconds will the client's time to first token (from sending the request) exceed
# the engine's (from receiving it), for the median request?

# %%
from kvlab.lessons.common.predict import predict

guess = predict("On loopback, the median of client TTFT (from sending) minus engine TTFT, request by request?",
                unit="ms")
guess

# %%
from kvlab.lessons.l09_measure_a_real_server.wire import client_vs_engine, overhead_table
from kvlab.lessons.l09_measure_a_real_server.figures_wire import plot_client_vs_engine

side = client_vs_engine(srv.url, num_requests=20, rate=20)
display(guess.fold(overhead_table(side).round(2)))
display(guess.fold(plot_client_vs_engine(side), what="this figure"))

# %%
guess.against(1e3 * side["ttft_overhead_s"].median())

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
# **Reading it.** On loopback the wire adds little: compare the overhead rows with the engine's own
# TTFT in the table, and later with the waits under load in section 4. Across a real network add the
# round trip, TLS, proxies and load balancers, none of which the engine's own clocks can see. That
# is why service-level targets are measured at the client.
#
# The first row is larger than the second by the client's own send delay. On a busy machine that
# part can be the biggest: the load generator is a program competing for the same CPU.

# %% [markdown]
# <!-- kvlab:exercise check_http_overhead -->

# %% [markdown]
# ## 4. A service curve over the wire
#
# Now raise the load. The panel offers each rate for the same length of time (`duration_s=1.5`:
# 12 requests at 8 per second, 192 at 128 per second), with the same profile and seed. Below
# capacity the server keeps up: completed requests per second follow the offered rate and the wait
# stays short. Past capacity the wait grows, and once the queue of 8 is full the server turns
# requests away with 429, so fewer complete than were sent. Press **Run**, or change the rates first.

# %%
from kvlab.lessons.l09_measure_a_real_server.wire import server_metrics, wait_until_idle
from kvlab.lessons.l09_measure_a_real_server.panel_wire import wire_panel

panel = wire_panel(srv.url, rates=(8, 32, 128), duration_s=1.5)
panel

# %%
before = wait_until_idle(srv.url)      # the server's own counters, before the runs
curve = panel.run()                     # the same as pressing Run
after = wait_until_idle(srv.url)
curve.show()

# %% [markdown]
# Every request of every rate must be accounted for, and the server's own counters (its Prometheus
# `/metrics`) must tell the same story as the client's records:

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

# %% [markdown]
# Why is the achieved rate below the offered one even at a rate where nothing was turned away? Two
# reasons, both in the table. The seeded Poisson schedule sends *close to* the offered rate, not
# exactly it: `sent req/s` is the requests sent over the span from the first to the last scheduled
# arrival. That schedule is the same on every machine:

# %%
# NBVAL_CHECK_OUTPUT
verdicts(curve.frame, "seeded_schedule_sends_near_offered")

# %% [markdown]
# And the achieved rate divides the completed requests by the measurement window, `window s`, which
# runs from the first arrival until the last answer ends: the last answers finish after the last
# request was sent. Over a short run that drain is a visible part of the window. What your run shows,
# at the highest rate where nothing was turned away, and past capacity:

# %%
verdicts(curve.frame, "achieved_rate_below_offered_explained", "full_queue_turns_requests_away",
         "wait_grows_past_capacity")

# %% [markdown]
# **Reading the figure.** Left: achieved against offered load on log axes; on the dashed diagonal
# the server keeps up. The labels count completed requests, and rejected ones in red. Right: TTFT
# and E2E of the completed requests. Note what the right panel cannot show: a rejected request has
# no TTFT at all. Under overload the quantiles describe the requests that got in, so the counts
# must go next to them: `n` in the table and on the figure. The last column, *client late*, is how
# far the load generator itself fell behind its schedule; each clock already includes that delay,
# but if it grows large, the client is the bottleneck of the measurement and the server is not
# being offered the load you asked for.
#
# ### Try it
#
# - Add 256 and 512 requests per second. Does the achieved rate rise any further? Watch *client
#   late*: on two shared cores the load generator competes with the server for the CPU.
# - Switch the profile to `long_gen` (long answers). Where does the curve bend now, and why does
#   TPOT matter more than TTFT for these requests?
# - Run the same settings twice. How much do the numbers move? Other programs on this computer
#   compete for the same two cores as the server *and* the load generator.
# - Stop the server, start one with a longer queue (`srv = start_server(max_waiting=64)`), make a new
#   panel for it and rerun: fewer rejections (429), and what happens to the TTFT of the requests that now wait instead?

# %% [markdown]
# <!-- kvlab:exercise check_output_tokens_per_s -->

# %% [markdown]
# <!-- kvlab:exercise check_rejections_and_quantiles -->

# %% [markdown]
# ## 5. The same measurement against vLLM (or SGLang, TGI, llama.cpp)
#
# Nothing above depends on the server being kvlab's, except the engine-side records of section 3.
# vLLM, SGLang, TGI and llama.cpp's `llama-server` all speak the same OpenAI-compatible streaming
# API, so the load generator, the records, the summaries and the plots work unchanged.
#
# Start a server on a machine with a GPU (replace the model with yours):
#
# | engine | start it | listens on |
# |---|---|---|
# | vLLM | `vllm serve Qwen/Qwen2.5-0.5B-Instruct` | port 8000 |
# | SGLang | `python -m sglang.launch_server --model-path Qwen/Qwen2.5-0.5B-Instruct` | port 30000 |
# | llama.cpp | `llama-server -m model.gguf` | port 8080 |
# | TGI | `docker run --gpus all -p 8080:80 ghcr.io/huggingface/text-generation-inference --model-id <model>` | port 8080 |
#
# Then measure it from any machine that can reach it, with the same command you would point at
# kvlab's server, in a terminal (`HOST` is the server's address; `--json` saves the summary where
# you run the command):
#
# ```
# python -m kvlab loadtest --url http://HOST:8000 --model Qwen/Qwen2.5-0.5B-Instruct \
#     --profile mixture --rate 4 --num-requests 200 --ignore-eos --json vllm.json
# ```
#
# Or from this notebook: the cell below does nothing until you give it your server's address.

# %%
# NBVAL_CHECK_OUTPUT
VLLM_URL = None                           # your server, e.g. "http://HOST:8000"; None skips this cell
VLLM_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"  # the model it serves

if VLLM_URL is None:
    print('skipped: set VLLM_URL = "http://HOST:8000" (your server) and VLLM_MODEL above, then run this cell again')
else:   # records, summary, and this notebook's service curve; nothing is written to disk
    from kvlab.lessons.l09_measure_a_real_server.wire import wire_service_curve
    from kvlab.lessons.l09_measure_a_real_server.figures_wire import plot_wire_service_curve

    vllm = measure_at_client(VLLM_URL, num_requests=200, rate=4, profile="mixture", model=VLLM_MODEL)
    display(vllm.summary().latency_frame())
    display(plot_wire_service_curve(wire_service_curve(VLLM_URL, rates=(1, 2, 4, 8, 16), duration_s=60,
                                                       profile="mixture", model=VLLM_MODEL)))  # a minute per rate

# %% [markdown]
# A few things to know when you do:
#
# - **Prompts** are sent as token ids, so the server sees exactly the lengths the workload asked for
#   (vLLM and SGLang accept them). For a server that only takes text, add `--prompt-format text`
#   (or `--chat` for `/v1/chat/completions`); the server's own prompt token count is kept per request.
# - **`--ignore-eos`** (vLLM and SGLang honour it; check your server's documentation) makes every answer as long as asked, as
#   here, so runs compare like for like. Without it, output tokens come from the server's `usage`.
# - **Engine-side clocks** of a production server come from its Prometheus `/metrics` (vLLM:
#   `vllm:time_to_first_token_seconds`, `vllm:num_requests_waiting`, ...), as histograms rather than
#   per-request records. Compare their quantiles with the client's.
# - **Where such engines take over.** kvlab runs one model on one device. When a model no longer
#   fits on one GPU, or one GPU cannot serve the traffic, engines like vLLM split each layer across
#   several GPUs of a machine (tensor parallelism, `vllm serve <model> --tensor-parallel-size 4`),
#   split the layers across machines (pipeline parallelism, `--pipeline-parallel-size`), run
#   replicas behind a load balancer, and add CUDA graphs and fused attention kernels. None of that
#   changes what is measured: requests go in at the client, tokens come back, and the four clocks,
#   the counts and the service curve are read the same way.

# %% [markdown]
# ## 6. The same client against a second engine
#
# Every measurement so far had one engine behind it, kvlab's. A measurement means more next to a
# second one, and a second real engine is already installed: transformers ships its own
# OpenAI-compatible server, `transformers serve`. With `--continuous-batching` it schedules
# requests step by step over a paged KV cache, the two ideas of notebooks 05 and 07, written by
# another team with other choices. vLLM and SGLang are the same kind of engine built for GPUs
# at production scale (section 5); `transformers serve` is the one that runs here, on this CPU.
#
# A fair comparison changes one thing only, the engine:
#
# - **the same weights**: the lesson model is saved once as a transformers checkpoint folder, with
#   a byte tokenizer that cuts text exactly as kvlab's does, and both servers load that folder
#   (the run checks it: both write the same greedy answer to one prompt);
# - **the same workload and client**: the seeded open-loop requests of section 4, sent as text by
#   the same load generator, every answer run to its `max_tokens` (kvlab's `ignore_eos`;
#   transformers refuses that field, so the client sends its equivalent, an end-of-sequence id that
#   never occurs);
# - **the same memory and budget**: KV blocks of 16 tokens, 512 of them, up to 512 tokens per step,
#   one CPU thread each, and only one server measured at a time (both start together, to save
#   your time, and the other sits idle while one is measured), so they never share a core.
#
# What stays different is each engine's own design, and that is what the run shows:
#
# | | kvlab serve (kvlab's choices) | transformers serve --continuous-batching |
# |---|---|---|
# | scheduling | decode first, then prompt chunks fill the step's token budget (chunked prefill) | its continuous-batching scheduler fills each step from the waiting requests within the same token budget |
# | attention | kvlab's own over its block table | transformers' paged attention |
# | at start | the model is loaded and the engine built before `/health` answers | the model is loaded at start; the batching manager and its cache are built when the first request arrives |
# | prefix cache | on, but this workload shares no prefix, so it plays no part here | not used by this workload either |
#
# The panel starts both servers, measures kvlab's **cold** (the first few requests after it started),
# sends a few warm-up requests, measures it **warm** at the same low rate, then sweeps the mixture
# profile (long prompts and long answers among short ones) up to its *knee*: the highest rate at
# which at least nine requests in ten completed and the first token's p95 stayed within the bound.
# Each rate is read at its *close*, a few seconds after its last request was sent: an engine that
# has fallen behind is not waited out, its unfinished requests count as waiting, and the p95 of the
# first token is over every request sent, an unanswered one counted at its wait so far (the
# survivors alone would flatter it). Then it stops kvlab's server and does the same with
# `transformers serve`. Where `transformers serve` cannot
# run (an older transformers, or `accelerate` missing), the next cell says why in one line and the
# panel measures kvlab's server alone.

# %%
from kvlab.http.peer import transformers_serve_available
from kvlab.lessons.l09_measure_a_real_server.panel_two_engines import two_engines_panel

ok, why = transformers_serve_available()
print(why if ok else f"transformers serve is unavailable here: {why}. The panel measures kvlab serve alone.")
engines = two_engines_panel(rates=(8, 24, 48), duration_s=1.0)
engines

# %%
both = engines.run()   # the same as pressing Run: both start, then each in turn: cold, warm, the sweep
both.show()

# %% [markdown]
# First count, then time, as before; and check that the two servers really hold the same weights:

# %%
verdicts(both.frame, "two_engines_account_for_every_request", "two_engines_same_weights")

# %% [markdown]
# What differed between the engines on your run:

# %%
verdicts(both.frame, "two_engines_at_low_load", "cold_start_costs_the_first_requests", "per_token_time_under_load",
         "kvlab_knee_beyond_transformers")

# %% [markdown]
# **Reading it.** At low load little waits, so TTFT is one prompt's prefill plus the plumbing,
# and TPOT is one decode step with a nearly empty batch: that is each engine's step overhead. The
# cold rows can pay for what an engine does only once: transformers builds its batching manager and
# paged cache on the first request, so a server that looks fast when warm can make its first users
# wait (the verdict says whether the cold requests were clearly slower on your run; a few cold
# requests on a busy machine may not show it). Measure the two apart, and warm a server up before
# you time it. Under load the per-token time grows with the batch on both engines, and how fast it
# grows is the scheduler's and the attention kernel's work per step; where it grows faster, the
# queue builds sooner and the knee can come at a lower rate (on a coarse ladder of rates two knees
# can still land on the same rung). The knee, not the low-load latency, is what decides how many
# machines a service needs.
#
# A benchmark repeats this in paired rounds, with the engine order rotated, and prints kvlab's
# latency and knee as ratios to transformers' with their spread: `python -m kvlab bench serve`.
# A note of caution that applies to every comparison of engines: this is a tiny model on a CPU,
# where fixed costs per step dominate; on a GPU with a real model the balance between scheduling
# overhead and arithmetic is different, and so can the ranking be.

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
# - The wait a person feels is measured at the client, from the moment the request was due to be
#   sent: open loop, so a slow client or a full queue cannot hide any of it.
# - First count, then time: every request sent is completed, rejected (429) or failed for a stated
#   reason, and the tokens asked for, reported and received agree. The server's own counters agree too.
# - On loopback, HTTP and streaming add little to the first token (your run's figure is in section 3's
#   verdict); under load, the queue dominates. Over a real network, the parts only the client sees grow.
# - The service curve over the wire: throughput follows the offered load up to capacity; past it
#   the wait climbs, and a bounded queue answers the excess with 429 at once.
#   Quantiles cover only completed requests, so quote the counts with them. The achieved rate divides
#   by a window that outlasts the arrivals, and a seeded schedule sends near the offered rate, not at it.
# - The same command measures vLLM, SGLang, TGI or llama.cpp's server; multi-GPU and multi-node
#   serving is their ground, and the clocks are read the same way there.
# - Two engines on the same weights, workload and client differ in what their design costs: cold start,
#   the time of a step, and so the rate where the queue starts to grow (the knee). Measure cold and warm apart.
# - Behind this notebook: `kvlab.lessons.l09_measure_a_real_server.wire` (`start_server`, `measure_at_client`, `accounting`,
#   `client_vs_engine`, `overhead_table`, `server_metrics`, `wire_service_curve`), `kvlab.lessons.l09_measure_a_real_server.two_engines`
#   (`compare_engines`), `kvlab.http.peer` (`transformers serve`), `kvlab.http`
#   (`server`, `loadgen`, `compare`), `kvlab.lessons.l09_measure_a_real_server.figures_wire`, `kvlab.lessons.l09_measure_a_real_server.panel_wire`, the claims in
#   `kvlab/lessons/l09_measure_a_real_server/claims.py`; tests in `tests/test_experiments_wire.py`,
#   `tests/test_http_server.py`, `tests/test_loadgen.py` and `tests/test_claims_09.py`.

# %% [markdown]
# <!-- kvlab:navigation -->
