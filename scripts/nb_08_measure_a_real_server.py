"""Write notebooks/08_measure_a_real_server.ipynb (and with --execute, run it and save its outputs).

    python scripts/nb_08_measure_a_real_server.py              # write the notebook, no outputs
    python scripts/nb_08_measure_a_real_server.py --execute    # write, run top to bottom, save with outputs

The vLLM section's code cells start with `# NBVAL_SKIP` (nbval skips them) and carry the
`skip-execution` tag (nbclient, and so --execute, skips them): they need a GPU server elsewhere.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell

sys.path.insert(0, str(Path(__file__).parent))
from build_notebooks import write_notebook, SETUP, header, navigation  # noqa: E402

from kvlab.course import lesson  # noqa: E402

FILE = "08_measure_a_real_server.ipynb"


def skipped_cell(source: str) -> nbformat.NotebookNode:
    """A code cell nbval skips (`# NBVAL_SKIP`) and nbclient does not run (`skip-execution` tag)."""
    cell = new_code_cell("# NBVAL_SKIP\n" + source)
    cell.metadata["tags"] = ["skip-execution"]
    return cell


def cells() -> list:
    entry = lesson(FILE)
    return [
        new_markdown_cell(header(entry, "08") + """

Every clock in the notebooks so far was stamped inside the engine. The person waiting is somewhere
else: at the other end of a network connection, behind an HTTP server that has to parse the
request, hand it to the engine, and send each token back as it comes. Their wait starts when they
press enter and ends when the last token reaches their screen. This notebook measures at that
end: kvlab's engine runs behind a real HTTP server, and a load generator sends it requests over
a real socket, just as it would send them to vLLM."""),
        new_code_cell(SETUP),
        new_code_cell('''%matplotlib inline
# The server and the load generator need kvlab's "serve" extra: FastAPI, uvicorn, httpx.
missing = [m for m in ("fastapi", "uvicorn", "httpx") if importlib.util.find_spec(m) is None]
if missing:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q",
                           "fastapi>=0.110", "uvicorn>=0.27", "httpx>=0.27"])
    importlib.invalidate_caches()
print("server packages:", "installed now" if missing else "present")'''),
        new_markdown_cell("""## What you will be able to do

- start an OpenAI-compatible server for kvlab's engine and talk to it like any other server;
- measure the four clocks **at the client**, starting each one at the request's scheduled arrival;
- account for every request you sent: completed, rejected by backpressure (HTTP 429), or failed for a stated reason;
- put client and engine clocks of the same requests side by side, and say what HTTP and streaming add;
- draw a service curve over the wire and read where the server stops keeping up;
- point the same command at a vLLM (or SGLang, TGI, llama.cpp) deployment."""),
        new_markdown_cell("""## 1. A server on this machine

`python -m kvlab serve` puts the serving engine of notebooks 05 and 07 behind the HTTP API most
LLM servers speak, OpenAI's: `POST /v1/completions` and `/v1/chat/completions`, streamed as
server-sent events. One engine loop batches the requests of every connection. Its waiting queue
is bounded: when it is full, the server answers **429 Too Many Requests** at once instead of
letting the line grow without end (*backpressure*).

The cell starts it as a separate process with this notebook's Python, on `127.0.0.1` (only
this machine can reach it) and a free port. The model is the small Llama of the test suite, so
the text is noise but the timings are those of real work. The queue is set to 8, deliberately
small, so a few dozen requests are enough to overflow it. The server is stopped at the end of
the notebook, and also if the kernel exits before that."""),
        new_code_cell('''from kvlab.experiments.wire import start_server

srv = start_server(max_waiting=8)
print("the same in a terminal:  python " + " ".join(srv.cmd[1:]))
print("serving at", srv.url)'''),
        new_markdown_cell("""It speaks OpenAI's API, so any client that can talk to OpenAI can talk to it. Here is one
streamed request, read line by line with a plain HTTP client: each `data:` line is one
server-sent event carrying one token, then a `usage` event counts the tokens, and `[DONE]`
closes the stream."""),
        new_code_cell('''import httpx
from kvlab.http.loadgen import discover_model

model_name = discover_model(srv.url)          # GET /v1/models: the name the server answers to
body = {"model": model_name, "prompt": "The cache keeps", "max_tokens": 4, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": True}
with httpx.stream("POST", srv.url + "/v1/completions", json=body, trust_env=False) as resp:
    for line in resp.iter_lines():   # trust_env=False: loopback, so ignore any proxy settings
        if line:
            print(line[:150])'''),
        new_markdown_cell("""## 2. Measure at the client

The load generator (`kvlab.http.loadgen`, also `python -m kvlab loadtest`) sends a seeded
workload **open loop**: each request leaves at its scheduled time whether or not earlier ones
have been answered, as real users do. Each clock starts at the *scheduled* arrival, so a client
that falls behind cannot hide a wait; the column `send_delay_s` shows how far behind it fell. A
token is stamped when its event is read from the socket. Every request asks for `ignore_eos`, so
it writes exactly its `max_tokens` and we know in advance how many tokens must come back.

20 short chat-like requests at 8 per second, Poisson arrivals:"""),
        new_code_cell('''from kvlab.experiments.wire import accounting, measure_at_client

result = measure_at_client(srv.url, num_requests=20, rate=8)
result.summary().latency_frame()   # seconds; n = completed requests behind each quantile'''),
        new_markdown_cell("""Before reading any latency, check that every request is accounted for and that the tokens add
up. The tokens are counted three ways: what the workload asked for, what the server reported
in `usage`, and how many text events the client actually received."""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
acc = accounting(result)
print(f"sent {acc['sent']}: every request accounted for (completed + rejected + failed = sent): "
      f"{acc['accounted_for']}")
print(f"output tokens, expected vs reported vs received all equal: "
      f"{acc['tokens_asked'] == acc['tokens_usage'] == acc['tokens_streamed']} (counted from {acc['output_tokens_from']})")'''),
        new_code_cell('''print(f"completed {acc['completed']}, rejected {acc['rejected']}, other failures {acc['failed_other']}; "
      f"tokens: asked {acc['tokens_asked']}, usage {acc['tokens_usage']}, streamed {acc['tokens_streamed']}")
result.frame()[["request_id", "prompt_tokens", "output_tokens", "scheduled_s", "send_delay_s", "ttft_s",
                "tpot_s", "e2e_s"]].head(8)'''),
        new_markdown_cell("""One row per request, the same `RequestRecord`s and columns as the in-process runs of notebooks
04 and 05: the plots and summaries of those notebooks work on these frames unchanged.

## 3. The same requests, timed at both ends

kvlab's server also keeps the engine's own record of each recent request (`GET /kvlab/requests`),
stamped from the moment the server received it. The client knows each answer's id, so the two
records of one request can be joined. At a low, steady rate nothing waits for a batch slot, and
the difference between the two clocks is the plumbing: sending the request, the server's event
loop handing it to the engine thread, and streaming the token back.

The two machines' clocks need not agree: the difference is taken per request, between
*durations* measured on each side."""),
        new_code_cell('''from kvlab.experiments.wire import client_vs_engine, overhead_table
from kvlab.plots.wire import plot_client_vs_engine

side = client_vs_engine(srv.url, num_requests=20, rate=10)
display(overhead_table(side).round(2))
plot_client_vs_engine(side)'''),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
print("every request ends later at the client than in the engine (overhead >= 0):",
      bool((side["ttft_overhead_s"] >= 0).all()))
print("client and engine counted the same output tokens:",
      bool((side["output_tokens"] == side["engine_output_tokens"]).all()))'''),
        new_code_cell('''print(f"{len(side)} requests timed at both ends; median TTFT overhead "
      f"{side['ttft_overhead_s'].median() * 1e3:.2f} ms (kvlab's goal on loopback: <= 5 ms), "
      f"next to a median engine TTFT of {side['engine_ttft_s'].median() * 1e3:.2f} ms")'''),
        new_markdown_cell("""**Reading it.** On loopback the wire adds a millisecond or a few: small next to a real model's
prefill, and small next to the queueing you will see in a moment. Across a real network add the
round trip, TLS, proxies and load balancers, none of which the engine's own clocks can see. That
is why service-level targets are measured at the client.

The first row is larger than the second by the client's own send delay. On a busy machine that
part can be the biggest: the load generator is a program competing for the same CPU.

### Exercise 1: what the wire adds

Write a function `overhead_ms(frame)` that takes a side-by-side frame like `side` and returns the
median over requests of *client TTFT from sending − engine TTFT*, in milliseconds. The checker
tries it on frames built so that each common slip gives a different number."""),
        new_code_cell('''from kvlab.exercises import check_http_overhead

overhead_ms = None   # replace None with your function, e.g.  def overhead_ms(frame): return ...
check_http_overhead(overhead_ms)'''),
        new_markdown_cell("""<details><summary>Solution</summary>

```python
def overhead_ms(frame):
    return float(((frame["client_ttft_from_sent_s"] - frame["engine_ttft_s"]) * 1e3).median())

overhead_ms(side)
```

Subtract per request, then take the median: the median of the client's times minus the median of
the engine's times pairs up different requests. Starting at `client_ttft_s` would add the client's
own send delay, which is not the wire's doing.
</details>"""),
        new_markdown_cell("""## 4. A service curve over the wire

Now raise the load. The panel offers each rate for the same length of time (1.5 seconds: 12
requests at 8 per second, 192 at 128 per second), with the same profile and seed. Below
capacity the server keeps up: completed requests per second follow the offered rate and the wait
stays short. Past capacity, throughput flattens, the wait grows, and once the queue of 8 is full
the server turns requests away with 429. Press **Run**, or change the rates first."""),
        new_code_cell('''from kvlab.experiments.wire import server_metrics, wait_until_idle
from kvlab.widgets.wire import wire_panel

panel = wire_panel(srv.url, rates=(8, 32, 128), duration_s=1.5)
panel'''),
        new_code_cell('''before = wait_until_idle(srv.url)      # the server's own counters, before the runs
curve = panel.run()                     # the same as pressing Run
after = wait_until_idle(srv.url)
curve.show()'''),
        new_markdown_cell("""Every request of every rate must be accounted for, and the server's own counters (its Prometheus
`/metrics`) must tell the same story as the client's records:"""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
table = curve.frame
for row in table.itertuples():
    print(f"{row.offered_rps:5.0f} req/s offered: {row.sent} sent, every one accounted for: {row.accounted_for}")
served = {k: after["requests_total"][k] - before["requests_total"][k] for k in after["requests_total"]}
print("client and server agree on completed:", served["completed"] == table["completed"].sum(),
      "| on rejected (429):", served["rejected_queue_full"] == table["rejected"].sum())
print("tokens generated by the engine = tokens received by the client:",
      after["generation_tokens_total"] - before["generation_tokens_total"] == table["tokens_streamed"].sum())
print("KV blocks still held once the server is idle:", after["kv_blocks_used"])'''),
        new_markdown_cell("""**Reading the figure.** Left: achieved against offered load on log axes; on the dashed diagonal
the server keeps up. The labels count completed requests, and rejected ones in red. Right: TTFT
and E2E of the completed requests. Note what the right panel cannot show: a rejected request has
no TTFT at all. Under overload the quantiles describe the requests that got in, so the counts
must go next to them. The last column of the table, *client late*, is how far the load generator
itself fell behind its schedule; each clock already includes that delay, but if it grows large,
the client is the bottleneck of the measurement and the server is not being offered the load
you asked for.

### Try it

- Add 256 and 512 requests per second. Does the achieved rate rise any further? Watch *client
  late*: on two shared cores the load generator competes with the server for the CPU.
- Switch the profile to `long_gen` (long answers). Where does the curve bend now, and why does
  TPOT matter more than TTFT for these requests?
- Run the same settings twice. How much do the numbers move? Other programs on this computer
  compete for the same two cores as the server *and* the load generator.
- Stop the server, start one with a longer queue (`srv = start_server(max_waiting=64)`), make a new
  panel for it and rerun: fewer 429s, and what happens to the TTFT of the requests that now wait instead?

### Exercise 2: throughput, as the service sees it

Write `throughput(frame)`: the output tokens per second of a run, from its requests frame
(`result.frame()`), counted as vLLM's benchmark does: output tokens of the **completed** requests
divided by the run's duration, from the first scheduled arrival to its last event."""),
        new_code_cell('''from kvlab.exercises import check_output_tokens_per_s

throughput = None   # replace None with your function, e.g.  def throughput(frame): return ...
check_output_tokens_per_s(throughput)'''),
        new_markdown_cell("""<details><summary>Solution</summary>

```python
def throughput(frame):
    done = frame[frame["status"] == "completed"]
    return done["output_tokens"].sum() / (frame["finished_s"].max() - frame["scheduled_s"].min())

print(throughput(result.frame()), "vs kvlab's summary:", result.summary().output_tokens_per_s)
```

The requests overlap in time, so dividing by the sum of their E2E times undercounts; averaging each
request's own pace answers a different question (what one person saw).
</details>

### Exercise 3: fewer answers, better numbers?

A colleague runs this panel and reports: "TTFT p90 stays under a second even at 128 requests
per second." The table shows that a large share of the requests at that rate were rejected
with 429. What follows?

- **a.** The server serves 128 requests per second with a good TTFT.
- **b.** Latency quantiles cover completed requests only; the counts of rejected and failed requests belong next to them.
- **c.** The load generator lost the rejected requests, so they are missing from the numbers."""),
        new_code_cell('''from kvlab.exercises import check_rejections_and_quantiles

check_rejections_and_quantiles(None)   # replace None with "a", "b" or "c"'''),
        new_markdown_cell("""<details><summary>Solution</summary>

**b.** A rejected user got no answer at all, yet has no TTFT to put in a quantile. The load
generator keeps a record of every request (a rejection has `fail_reason` `http_429:queue_full`),
which is how the counts above could be checked against the server's own. To compare loads with
one number, count the requests that completed *and* met a target (goodput:
`result.summary(slo=kvlab.clocks.SLO(ttft_s=0.5))`).
</details>"""),
        new_markdown_cell("""## 5. The same measurement against vLLM (or SGLang, TGI, llama.cpp)

Nothing above depends on the server being kvlab's, except the engine-side records of section 3.
vLLM, SGLang, TGI and llama.cpp's `llama-server` all speak the same OpenAI-compatible streaming
API, so the load generator, the records, the summaries and the plots work unchanged.

Start a server on a machine with a GPU (these cells are not run here; replace `HOST` and the model):

| engine | start it | listens on |
|---|---|---|
| vLLM | `vllm serve Qwen/Qwen2.5-0.5B-Instruct` | port 8000 |
| SGLang | `python -m sglang.launch_server --model-path Qwen/Qwen2.5-0.5B-Instruct` | port 30000 |
| llama.cpp | `llama-server -m model.gguf` | port 8080 |
| TGI | `docker run --gpus all -p 8080:80 ghcr.io/huggingface/text-generation-inference --model-id <model>` | port 8080 |

Then measure it from any machine that can reach it, with the same command you would point at
kvlab's server:"""),
        skipped_cell('''# In a terminal (or here, with the leading "!"): the four clocks of a vLLM server, saved as JSON
!python -m kvlab loadtest --url http://HOST:8000 --model Qwen/Qwen2.5-0.5B-Instruct \\
    --profile mixture --rate 4 --num-requests 200 --ignore-eos --json vllm.json'''),
        skipped_cell('''# The same from Python: records, summary, and this notebook's service curve and panel
from kvlab.experiments.wire import measure_at_client, wire_service_curve
from kvlab.plots.wire import plot_wire_service_curve

VLLM_URL, VLLM_MODEL = "http://HOST:8000", "Qwen/Qwen2.5-0.5B-Instruct"
vllm = measure_at_client(VLLM_URL, num_requests=200, rate=4, profile="mixture", model=VLLM_MODEL)
display(vllm.summary().latency_frame())
plot_wire_service_curve(wire_service_curve(VLLM_URL, rates=(1, 2, 4, 8, 16), duration_s=60,
                                           profile="mixture", model=VLLM_MODEL))   # a minute per rate'''),
        new_markdown_cell("""A few things to know when you do:

- **Prompts** are sent as token ids, so the server sees exactly the lengths the workload asked for
  (vLLM and SGLang accept them). For a server that only takes text, add `--prompt-format text`
  (or `--chat` for `/v1/chat/completions`); the server's own prompt token count is kept per request.
- **`--ignore-eos`** (vLLM and SGLang honour it; check your server's documentation) makes every answer as long as asked, as
  here, so runs compare like for like. Without it, output tokens come from the server's `usage`.
- **Engine-side clocks** of a production server come from its Prometheus `/metrics` (vLLM:
  `vllm:time_to_first_token_seconds`, `vllm:num_requests_waiting`, ...), as histograms rather than
  per-request records. Compare their quantiles with the client's.
- **Where such engines take over.** kvlab runs one model on one device. When a model no longer
  fits on one GPU, or one GPU cannot serve the traffic, engines like vLLM split each layer across
  several GPUs of a machine (tensor parallelism, `vllm serve <model> --tensor-parallel-size 4`),
  split the layers across machines (pipeline parallelism, `--pipeline-parallel-size`), run
  replicas behind a load balancer, and add CUDA graphs and fused attention kernels. None of that
  changes what is measured: requests go in at the client, tokens come back, and the four clocks,
  the counts and the service curve are read the same way."""),
        new_markdown_cell("""## 6. Stop the server

A server you started is yours to stop. (If the kernel exits first, it is stopped then.)"""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
srv.stop()
print("server process ended:", srv.process.poll() is not None)'''),
        new_markdown_cell("""## Summary

- The wait a person feels is measured at the client, from the moment the request was due to be
  sent: open loop, so a slow client or a full queue cannot hide any of it.
- First count, then time: every request sent is completed, rejected (429) or failed for a stated
  reason, and the tokens asked for, reported and received agree. The server's own counters agree too.
- On loopback, HTTP and streaming add a millisecond or two to the first token; under load, the
  queue dominates. Over a real network, the parts only the client sees grow.
- The service curve over the wire: throughput follows the offered load up to capacity, then
  flattens while the wait climbs, and a bounded queue answers the excess with 429 at once.
  Quantiles cover only completed requests, so quote the counts with them.
- The same command measures vLLM, SGLang, TGI or llama.cpp's server; multi-GPU and multi-node
  serving is their ground, and the clocks are read the same way there.
- Behind this notebook: `kvlab.experiments.wire` (`start_server`, `measure_at_client`, `accounting`,
  `client_vs_engine`, `overhead_table`, `server_metrics`, `wire_service_curve`), `kvlab.http`
  (`server`, `loadgen`, `compare`), `kvlab.plots.wire`, `kvlab.widgets.wire`; tests in
  `tests/test_experiments_wire.py`, `tests/test_http_server.py` and `tests/test_loadgen.py`."""),
        new_markdown_cell(navigation(entry)),
    ]


def main() -> None:
    write_notebook(FILE, cells, __doc__)


if __name__ == "__main__":
    main()
