"""Decode attention that reads each sequence's K/V blocks where they lie in the paged pool (a CPU kernel).

The torch path (``PagedKVCache.attend``) copies a decoding sequence's blocks out of the pool into one tensor and
hands that to ``scaled_dot_product_attention``: every key and value is read, written and read again, and each
sequence is its own call once a padded batch would be too large. Decode attention is a few flops per byte, so on a
CPU its time is memory traffic and per-call overhead. This kernel walks each sequence's block table and reads every
slot once, in the pool: one call per layer for every decoding sequence of the step, whatever their lengths.

It is vLLM's approach (https://github.com/vllm-project/vllm/blob/main/csrc/cpu/cpu_attn.cpp on a CPU), written
small: one sequence per task, all its query heads per slot row, a two-pass softmax. It is C++ built once per machine
with the C++ compiler torch's extensions use (``torch.utils.cpp_extension.load_inline``, cached in torch's extensions
folder; about a minute the first time, for this machine's instruction set), for float32 pools on the CPU; every other
pool keeps the torch path. kvlab's choice, for teaching: the lessons keep the gather path (notebook 07's last
exercise writes it); ``python -m kvlab serve --attention in_place`` and the peers of ``bench serve`` and 09 use it.
"""
from __future__ import annotations

import functools

import torch

SOURCE = r"""
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

// q (D, nh, hs); k_pool, v_pool (num_blocks, bs, nkv, hs); block_tables (D, W) int64; context_lens (D,) int64
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  // Checked before any read: a bad table raises in its step (the engine fails that step's requests) instead of
  // reading outside the pool and taking the engine's process down with every other request.
  TORCH_CHECK(q.dim() == 3 && k_pool.dim() == 4 && v_pool.sizes() == k_pool.sizes() && block_tables.dim() == 2,
              "paged_decode_attention: q (D, nh, hs), pools (num_blocks, bs, nkv, hs), block_tables (D, W)");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_pool.scalar_type() == at::kFloat && v_pool.scalar_type() == at::kFloat
              && k_pool.is_contiguous() && v_pool.is_contiguous(), "paged_decode_attention: contiguous float32 only");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong
              && block_tables.is_contiguous() && context_lens.is_contiguous(), "paged_decode_attention: int64 tables");
  const int64_t D = q.size(0), nh = q.size(1), hs = q.size(2);
  const int64_t nb = k_pool.size(0), bs = k_pool.size(1), nkv = k_pool.size(2), W = block_tables.size(1);
  TORCH_CHECK(k_pool.size(3) == hs && nkv > 0 && nh % nkv == 0 && block_tables.size(0) == D
              && context_lens.numel() == D, "paged_decode_attention: shapes disagree");
  for (int64_t d = 0; d < D; ++d) {
    const int64_t L = context_lens.data_ptr<int64_t>()[d];
    TORCH_CHECK(L >= 1 && L <= W * bs, "paged_decode_attention: row ", d, " attends over ", L, " slots, its table ",
                "holds ", W * bs);
    for (int64_t j = 0; j < (L + bs - 1) / bs; ++j) {
      const int64_t b = block_tables.data_ptr<int64_t>()[d * W + j];
      TORCH_CHECK(b >= 0 && b < nb, "paged_decode_attention: row ", d, " names block ", b, " of a pool of ", nb);
    }
  }
  const int64_t g = nh / nkv;
  const at::Tensor qc = q.contiguous();
  at::Tensor out = at::empty_like(qc);
  const float* Q = qc.data_ptr<float>();
  const float* K = k_pool.data_ptr<float>();
  const float* V = v_pool.data_ptr<float>();
  const int64_t* T = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  float* O = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, D, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s, acc(nh * hs), z(nh);
    for (int64_t d = begin; d < end; ++d) {
      const int64_t L = lens[d];
      const int64_t* table = T + d * W;
      const float* qd = Q + d * nh * hs;
      s.resize(nh * L);
      for (int64_t t = 0; t < L; ++t) {  // scores: each slot's row (nkv, hs) read once, for every query head
        const float* kt = K + (table[t / bs] * bs + t % bs) * nkv * hs;
        for (int64_t j = 0; j < nh; ++j) {
          const float* qj = qd + j * hs;
          const float* kh = kt + (j / g) * hs;
          float dot = 0.f;
#pragma omp simd reduction(+:dot)
          for (int64_t c = 0; c < hs; ++c) dot += qj[c] * kh[c];
          s[j * L + t] = dot * sc;
        }
      }
      for (int64_t j = 0; j < nh; ++j) {  // softmax per head (a NaN score stays NaN: a fault stays visible)
        float* sj = s.data() + j * L;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < L; ++t) mx = std::max(mx, sj[t]);
        float sum = 0.f;
        for (int64_t t = 0; t < L; ++t) { sj[t] = std::exp(sj[t] - mx); sum += sj[t]; }
        z[j] = sum;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < L; ++t) {  // values, weighted: each slot's row read once
        const float* vt = V + (table[t / bs] * bs + t % bs) * nkv * hs;
        for (int64_t j = 0; j < nh; ++j) {
          const float p = s[j * L + t];
          const float* vh = vt + (j / g) * hs;
          float* a = acc.data() + j * hs;
#pragma omp simd
          for (int64_t c = 0; c < hs; ++c) a[c] += p * vh[c];
        }
      }
      float* o = O + d * nh * hs;
      for (int64_t j = 0; j < nh; ++j)
        for (int64_t c = 0; c < hs; ++c) o[j * hs + c] = acc[j * hs + c] / z[j];
    }
  });
  return out;
}

TORCH_LIBRARY(kvlab_paged, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_pool, Tensor v_pool, Tensor block_tables, Tensor context_lens, "
        "float scale) -> Tensor");
  m.impl("paged_decode_attention", c10::DispatchKey::CPU, &paged_decode_attention);
}
"""


class KernelUnavailable(RuntimeError):
    """The in-place kernel could not be built here (no C++ compiler torch can use, or it failed)."""


@functools.cache
def load() -> None:
    """Build the kernel (the first time on a machine: about a minute) or load it from torch's extensions cache."""
    from torch.utils.cpp_extension import load_inline

    try:
        load_inline("kvlab_paged_attention", cpp_sources=SOURCE, is_python_module=False,
                    extra_cflags=["-O3", "-march=native", "-fopenmp-simd"])
    except Exception as exc:  # no compiler, or it failed: say what to use instead
        raise KernelUnavailable(
            f"the in-place decode attention kernel could not be built ({type(exc).__name__}: {exc}); it needs the C++ "
            "compiler torch's extensions use (g++ on Linux). Use the torch path instead: EngineSpec("
            "attention='gather'), or `serve` without --attention in_place") from exc
    # its output's shape and dtype without running it: what torch.compile traces the compiled decode step with
    torch.library.register_fake("kvlab_paged::paged_decode_attention")(lambda q, *_: torch.empty_like(q))


def applies(pool: torch.Tensor) -> bool:
    """True for the pools the kernel reads: float32 on the CPU (any other pool keeps the torch path)."""
    return pool.device.type == "cpu" and pool.dtype == torch.float32


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                           context_lens: torch.Tensor) -> torch.Tensor:
    """q (D, nh, hs) one query per sequence -> (D, nh, hs), each over the first ``context_lens[i]`` slots its
    ``block_tables[i]`` (D, W) names in ``k_pool``, ``v_pool`` (num_blocks, bs, nkv, hs); entries of a table past
    its length are never read. ``load()`` first (``PagedKVCache(attention="in_place")`` does, when it is made)."""
    return torch.ops.kvlab_paged.paged_decode_attention(q, k_pool, v_pool, block_tables, context_lens,
                                                        q.size(-1) ** -0.5)
