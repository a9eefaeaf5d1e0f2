"""Decode attention that reads each sequence's K/V blocks where they lie in the paged pool (a CPU kernel).

The torch path (``PagedKVCache.attend``) copies a decoding sequence's blocks out of the pool into one tensor and
hands that to ``scaled_dot_product_attention``: every key and value is read, written and read again, and each
sequence is its own call once a padded batch would be too large. Decode attention is a few flops per byte, so on a
CPU its time is memory traffic and per-call overhead. This kernel walks each sequence's block table and reads every
slot once, in the pool: one call per layer for every decoding sequence of the step, whatever their lengths.

It is vLLM's approach (https://github.com/vllm-project/vllm/blob/main/csrc/cpu/cpu_attn.cpp on a CPU), written
small: one task per sequence and KV head, the query heads that share it scored on each key as it is read, a softmax
kept online chunk by chunk of slots (flash-decoding's running maximum, so a chunk's keys and values are read while
they sit in the L1 cache), and an ``exp`` written as a polynomial the compiler vectorises. Where the machine has AVX2
and FMA (most x86 CPUs since 2013) and the head size is 32, 64 or 128, a head's query and sums stay in registers and
the scores of 8 slots are summed across lanes together (1.4-1.9x on the same decodes, 2026-12-07); elsewhere the
portable loops run. It is C++ built once per
machine with the C++ compiler torch's extensions use (``torch.utils.cpp_extension.load_inline``, cached in torch's
extensions folder; about a minute the first time, for this machine's instruction set), for float32 pools on the CPU;
every other pool keeps the torch path. Prompt chunks keep torch's attention (a tiled prompt kernel written the same
way ran at half the speed of torch's flash attention, 2026-12-07, and was not kept). kvlab's choice, for teaching:
the lessons keep the gather path (notebook 07's last exercise writes it); ``python -m kvlab serve --attention
in_place`` and the peers of ``bench serve`` and 09 use it.
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
#include <cstring>
#include <limits>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

// exp(x) for x <= 0 (softmax's shifted scores), vectorisable: 2^n * p(r), r in [-ln2/2, ln2/2] (Cephes' expf
// polynomial, about 1 ulp); below -87, exp(-87) (1e-38, nothing beside the maximum's 1); a NaN stays NaN
inline float exp_neg(float x) {
  x = std::max(x, -87.0f);  // a NaN compares false, stays, and stays NaN through the arithmetic
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = static_cast<int32_t>(n) + 127;
  e = e < 0 ? 0 : e;
  uint32_t bits = static_cast<uint32_t>(e) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

constexpr int64_t CHUNK = 16;  // slots scored at a time (a block of more is walked in chunks of this many)

// Ask for the keys and values of the chunk that starts at slot t1 (if any) while the current one is scored: its block
// may lie anywhere in the pool, where no hardware prefetcher would look (10-50% on decodes whose pool is not in cache).
inline void prefetch_chunk(const float* K, const float* V, const int64_t* table, int64_t t1, int64_t L, int64_t bs,
                           int64_t row, int64_t hs) {
  if (t1 >= L) return;
  const int64_t n = std::min({L, t1 + CHUNK, (t1 / bs + 1) * bs}) - t1;
  const int64_t first = (table[t1 / bs] * bs + t1 % bs) * row;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < hs; c += 16) {  // one 64-byte line at a time
      __builtin_prefetch(K + first + t * row + c);
      __builtin_prefetch(V + first + t * row + c);
    }
}

// Scratch for one task: the group's scaled queries and sums (g, hs), running maxima, totals and a chunk's maxima (g,),
// scores (g, CHUNK).
struct Scratch {
  std::vector<float> q, acc, m, z, bm, s;
  Scratch(int64_t g, int64_t hs) : q(g * hs), acc(g * hs), m(g), z(g), bm(g), s(g * CHUNK) {}
  // A task's start: its g queries (g, hs) scaled, nothing summed yet.
  void start(const float* qin, int64_t g, int64_t hs, float sc) {
    for (int64_t j = 0; j < g; ++j) {
      for (int64_t c = 0; c < hs; ++c) { q[j * hs + c] = qin[j * hs + c] * sc; acc[j * hs + c] = 0.f; }
      m[j] = -std::numeric_limits<float>::infinity();
      z[j] = 0.f;
    }
  }
  // Its end: each head's weighted sum over its total weight, into o (g, hs).
  void finish(float* o, int64_t g, int64_t hs) const {
    for (int64_t j = 0; j < g; ++j)
      for (int64_t c = 0; c < hs; ++c) o[j * hs + c] = acc[j * hs + c] / z[j];
  }
};

// One sequence, one KV head and its g query heads: over each chunk of slots, the scores, a running maximum (what was
// summed is rescaled when it rises), then the values weighted. HS: the head size as a compile-time constant for the
// usual sizes (0: any, read from hs).
template <int64_t HS>
void attend(const float* q, const float* K, const float* V, const int64_t* table, int64_t L, int64_t bs,
            int64_t row, int64_t g, int64_t hs_any, float sc, float* o, Scratch& w) {
  const int64_t hs = HS > 0 ? HS : hs_any;
  float* qs = w.q.data();
  float* acc = w.acc.data();
  float* m = w.m.data();
  float* z = w.z.data();
  float* bm = w.bm.data();
  float* s = w.s.data();
  w.start(q, g, hs, sc);
  for (int64_t t0 = 0, t1 = 0; t0 < L; t0 = t1) {  // a chunk: slots t0 .. t1-1, all in one block
    t1 = std::min({L, t0 + CHUNK, (t0 / bs + 1) * bs});
    const int64_t first = table[t0 / bs] * bs + t0 % bs;  // the chunk's first slot in the pool
    prefetch_chunk(K, V, table, t1, L, bs, row, hs);
    for (int64_t j = 0; j < g; ++j) bm[j] = -std::numeric_limits<float>::infinity();
    for (int64_t t = t0; t < t1; ++t) {  // scores: each slot's key read once for the group's query heads
      const float* kt = K + (first + t - t0) * row;
      for (int64_t j = 0; j < g; ++j) {
        const float* qj = qs + j * hs;
        float dot = 0.f;
#pragma omp simd reduction(+:dot)
        for (int64_t c = 0; c < hs; ++c) dot += qj[c] * kt[c];
        s[j * CHUNK + t - t0] = dot;
        bm[j] = std::max(bm[j], dot);
      }
    }
    for (int64_t j = 0; j < g; ++j) {
      const float mn = std::max(m[j], bm[j]);
      float* aj = acc + j * hs;
      if (mn > m[j]) {  // a new maximum: rescale what was summed so far
        const float f = exp_neg(m[j] - mn);
        z[j] *= f;
#pragma omp simd
        for (int64_t c = 0; c < hs; ++c) aj[c] *= f;
        m[j] = mn;
      }
      float* sj = s + j * CHUNK;
      float sum = 0.f;
#pragma omp simd reduction(+:sum)
      for (int64_t t = 0; t < t1 - t0; ++t) { sj[t] = exp_neg(sj[t] - mn); sum += sj[t]; }
      z[j] += sum;
    }
    for (int64_t t = t0; t < t1; ++t) {  // values, weighted: each slot's value read once
      const float* vt = V + (first + t - t0) * row;
      for (int64_t j = 0; j < g; ++j) {
        const float p = s[j * CHUNK + t - t0];
        float* aj = acc + j * hs;
#pragma omp simd
        for (int64_t c = 0; c < hs; ++c) aj[c] += p * vt[c];
      }
    }
  }
  w.finish(o, g, hs);
}


#if defined(__AVX2__) && defined(__FMA__)
// The sums of 8 vectors' lanes, as one vector: lane i holds the sum of r[i]'s 8 lanes (six horizontal adds, two lane
// swaps and one add for 8 dot products, where each on its own would end in a chain of shuffles).
inline __m256 sum_lanes8(const __m256* r) {
  const __m256 t0 = _mm256_hadd_ps(r[0], r[1]), t1 = _mm256_hadd_ps(r[2], r[3]);
  const __m256 t2 = _mm256_hadd_ps(r[4], r[5]), t3 = _mm256_hadd_ps(r[6], r[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// attend<HS> with AVX2 intrinsics for head sizes that are a multiple of 8: a head's query and its chunk's sums held
// in registers; the scores of 8 slots reduced together.
template <int64_t HS>
void attend_avx2(const float* q, const float* K, const float* V, const int64_t* table, int64_t L, int64_t bs,
                 int64_t row, int64_t g, int64_t /*hs_any*/, float sc, float* o, Scratch& w) {
  constexpr int64_t NV = HS / 8;
  float* qs = w.q.data();
  float* acc = w.acc.data();
  float* m = w.m.data();
  float* z = w.z.data();
  float* s = w.s.data();
  w.start(q, g, HS, sc);
  for (int64_t t0 = 0, t1 = 0; t0 < L; t0 = t1) {  // a chunk: slots t0 .. t1-1, all in one block
    t1 = std::min({L, t0 + CHUNK, (t0 / bs + 1) * bs});
    const int64_t n = t1 - t0;
    const float* Kc = K + (table[t0 / bs] * bs + t0 % bs) * row;  // the chunk's first slot in the pool
    const float* Vc = V + (table[t0 / bs] * bs + t0 % bs) * row;
    if (t1 < L) {  // prefetch_chunk, written out: measured faster here than the call
      const int64_t nn = std::min({L, t1 + CHUNK, (t1 / bs + 1) * bs}) - t1;
      const int64_t off = (table[t1 / bs] * bs + t1 % bs) * row;
      for (int64_t t = 0; t < nn; ++t)
        for (int64_t c = 0; c < HS; c += 16) {
          _mm_prefetch(reinterpret_cast<const char*>(K + off + t * row + c), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(V + off + t * row + c), _MM_HINT_T0);
        }
    }
    for (int64_t j = 0; j < g; ++j) {
      __m256 qv[NV];
      for (int64_t v = 0; v < NV; ++v) qv[v] = _mm256_loadu_ps(qs + j * HS + 8 * v);
      float* sj = s + j * CHUNK;
      for (int64_t tb = 0; tb < n; tb += 8) {  // 8 slots' scores at a time
        __m256 r[8];
        for (int64_t u = 0; u < 8; ++u) {
          r[u] = _mm256_setzero_ps();
          if (tb + u < n) {
            const float* kt = Kc + (tb + u) * row;
            for (int64_t v = 0; v < NV; ++v) r[u] = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(kt + 8 * v), r[u]);
          }
        }
        _mm256_storeu_ps(sj + tb, sum_lanes8(r));
      }
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t t = 0; t < n; ++t) mx = std::max(mx, sj[t]);
      const float mn = std::max(m[j], mx);
      float* aj = acc + j * HS;
      __m256 a[NV];
      if (mn > m[j]) {  // a new maximum: rescale what was summed so far
        const float f = exp_neg(m[j] - mn);
        z[j] *= f;
        for (int64_t v = 0; v < NV; ++v) a[v] = _mm256_mul_ps(_mm256_set1_ps(f), _mm256_loadu_ps(aj + 8 * v));
        m[j] = mn;
      } else {
        for (int64_t v = 0; v < NV; ++v) a[v] = _mm256_loadu_ps(aj + 8 * v);
      }
      float sum = 0.f;
#pragma omp simd reduction(+:sum)
      for (int64_t t = 0; t < n; ++t) { sj[t] = exp_neg(sj[t] - mn); sum += sj[t]; }
      z[j] += sum;
      for (int64_t t = 0; t < n; ++t) {  // values, weighted, into the head's sums held in registers
        const __m256 p = _mm256_set1_ps(sj[t]);
        const float* vt = Vc + t * row;
        for (int64_t v = 0; v < NV; ++v) a[v] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vt + 8 * v), a[v]);
      }
      for (int64_t v = 0; v < NV; ++v) _mm256_storeu_ps(aj + 8 * v, a[v]);
    }
  }
  w.finish(o, g, HS);
}
#endif

}  // namespace

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
  const int64_t* T = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  for (int64_t d = 0; d < D; ++d) {
    const int64_t L = lens[d];
    TORCH_CHECK(L >= 1 && L <= W * bs, "paged_decode_attention: row ", d, " attends over ", L, " slots, its table ",
                "holds ", W * bs);
    for (int64_t j = 0; j < (L + bs - 1) / bs; ++j) {
      const int64_t b = T[d * W + j];
      TORCH_CHECK(b >= 0 && b < nb, "paged_decode_attention: row ", d, " names block ", b, " of a pool of ", nb);
    }
  }
  const int64_t g = nh / nkv, row = nkv * hs;
  const at::Tensor qc = q.contiguous();
  at::Tensor out = at::empty_like(qc);
  const float* Q = qc.data_ptr<float>();
  const float* K = k_pool.data_ptr<float>();
  const float* V = v_pool.data_ptr<float>();
  float* O = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
#if defined(__AVX2__) && defined(__FMA__)
  const auto run = hs == 32 ? attend_avx2<32> : hs == 64 ? attend_avx2<64> : hs == 128 ? attend_avx2<128>
                 : attend<0>;
#else
  const auto run = hs == 32 ? attend<32> : hs == 64 ? attend<64> : hs == 128 ? attend<128> : attend<0>;
#endif
  at::parallel_for(0, D * nkv, 1, [&](int64_t begin, int64_t end) {
    Scratch w(g, hs);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t d = i / nkv, h = i % nkv;
      run(Q + (d * nh + h * g) * hs, K + h * hs, V + h * hs, T + d * W, lens[d], bs, row, g, hs, sc,
          O + (d * nh + h * g) * hs, w);
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
                    extra_cflags=["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math"])
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

