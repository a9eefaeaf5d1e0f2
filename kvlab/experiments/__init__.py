"""What a notebook, a benchmark or a command runs: one experiment a module, each returning DataFrames (or a small
result object holding them) that claims, figures and benchmarks read.

By topic (``kvlab.course.NOTEBOOKS`` says which lesson runs which): a decoder's cost and memory (``slowdown``,
``long_context``, ``memory``, ``real_model``); caches (``strategies``, ``cache_accuracy``, ``static_compile``,
``offload_load``, ``transformers_caches``); one request's clocks (``four_clocks``, ``tokens_words``); batching
(``batching``, ``admission``, ``batch_scaling``); load (``service_curves``, ``sweep_cli``, ``capacity``,
``prefix_and_chunks``, ``prefix_traces``, on ``presets``); the wire (``wire``, ``two_engines``, ``three_engines``).

What they run with: ``serving_run`` (an engine on a fixed step cost), ``recall`` (the recall task with exactly checkable
answers) and ``quality`` (a cache's precision against exact), ``bandwidth`` (memory-bandwidth probes),
``transformers_steps`` (transformers' generate timed like kvlab); from the base layer, ``kvlab.rounds`` (interleaved
rounds, paired ratios with their spread, the machine's load), ``kvlab.progress`` (the protocol a panel's bar listens to)
and ``kvlab.provenance`` (the notebook cell that produced a result, so a prediction proves it came first).

An experiment imports the layers below (the model, the serving engine, HTTP), never a lesson: any lesson, a benchmark
(``kvlab.benchmarks``) or a command may run it.
"""
