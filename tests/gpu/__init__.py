"""The GPU check: every CUDA branch of kvlab, and the lessons' experiments, as tests on a device.

One command runs them on a lent GPU with the device-parametrised tests and writes the report
(test-artifacts/gpu_check.json and gpu_check.md; $OUT/ too when $OUT is set)::

    KVLAB_TEST_DEVICE=cuda KVLAB_DEVICE=cuda python -m pytest -m "gpu or not full" tests/gpu \\
        tests/test_cache_offloaded.py tests/test_cache_quantized.py tests/test_offloaded_link.py \\
        tests/test_generate.py tests/test_engine.py tests/test_paged_decode.py \\
        tests/test_pretrained_checkpoints.py tests/test_real_model.py tests/test_recall_task.py \\
        tests/test_lesson_scale.py

``python -m pytest -m gpu tests/gpu`` runs the GPU checks alone (CUDA when present; without it every one skips
with the reason, and the report says so). ``KVLAB_GPU_CHECK_DEVICE=cpu python -m pytest -m gpu tests/gpu`` runs
them on the CPU at small sizes, in a few minutes, to check their code without a GPU. The files, in the order
they run (each test ``full`` and ``gpu``, so the default ``pytest`` leaves them out):

1. test_1_caches.py: every cache mode on a random-weight Llama (llama_30m, and on CUDA a hidden-2048 / 16-layer
   shape): tokens equal dynamic's, the offloaded tier read off its tensor (pinned, its bytes), CUDA's allocator
   against the cache's device bytes; quantized bytes against the ideal ratio.
2. test_2_engine.py: the paged executor (chunked prefill, prefix caching, preemption, both decode paths,
   static batching): every request's tokens equal ``generate``'s; the pool's bytes against CUDA's.
3. test_3_checkpoints.py: tiny GPT-2, Llama and Qwen2 checkpoints loaded on the device against transformers;
   the real-model demonstration's memory against the formula.
4. test_4_half_precision.py: bf16 and fp16 through every cache and ``from_pretrained(dtype=...)``.
5. test_5_compiled_step.py: the compiled static step in a child bounded in time; on CUDA ``reduce-overhead``
   must capture a CUDA graph.
6. test_6_http_serve.py: ``python -m kvlab serve --device <device>`` driven by kvlab's load client.
7. test_7_bench.py: ``python -m kvlab bench decode`` at small settings, and notebook 05's ``batch_scaling``.
8. test_8_lessons.py: the notebooks' start-up check, the lessons' experiments at the device's sizes, and every
   notebook claim on its example as long as the budget lasts.

The device, the sizes, the budget and the report: tests/gpu/conftest.py; the verdict rules: tests/gpu/report.py
(unit-tested on fake numbers by tests/test_gpu_check.py); how to run it: tests/gpu/README.md.
"""
# The device-parametrised tests the one command adds (tests/conftest.py's ``device`` follows KVLAB_TEST_DEVICE).
DEVICE_TESTS = ["tests/test_cache_offloaded.py", "tests/test_cache_quantized.py", "tests/test_offloaded_link.py",
                "tests/test_generate.py", "tests/test_engine.py", "tests/test_paged_decode.py",
                "tests/test_pretrained_checkpoints.py", "tests/test_real_model.py", "tests/test_recall_task.py",
                "tests/test_lesson_scale.py"]
