"""What a notebook, a benchmark or a command runs: one experiment a module, each returning DataFrames (or a small
result object holding them) that claims, figures and benchmarks read.

By lesson (``kvlab.course.NOTEBOOKS`` names each lesson's): ``slowdown``, ``long_context`` (01); ``memory``,
``real_model`` (02); ``strategies``, ``cache_accuracy``, ``static_compile``, ``offload_load``,
``transformers_caches`` (03); ``four_clocks``, ``tokens_words`` (04); ``batching``, ``admission``,
``batch_scaling`` (05); ``service_curves``, the ``python -m kvlab sweep`` command (06); ``capacity`` (07);
``prefix_and_chunks``, ``prefix_traces`` (08); ``wire``, ``two_engines``, ``three_engines`` (09).

What they run with: ``serving_run`` (an engine on a fixed step cost), ``recall`` (the recall task with exactly
checkable answers) and ``quality`` (a cache's precision against exact), ``bandwidth`` (memory-bandwidth probes),
``transformers_steps`` (transformers' generate timed like kvlab); from the base layer, ``kvlab.rounds``
(interleaved rounds, paired ratios with their spread, the machine's load), ``kvlab.progress`` (the protocol a
panel's bar listens to) and ``kvlab.provenance`` (the notebook cell that produced a result, so a prediction
proves it came first).

An experiment imports the layers below (the model, the serving engine, HTTP), never a lesson: any lesson, a
benchmark (``kvlab.benchmarks``) or a command may run it.
"""
