// The speculative round's small CPU ops, one call each where torch took one op per row or per
// pool: the target's greedy ids (argmax over the vocabulary), the move of the accepted path's
// K/V and hidden rows, and the drafter's top-k of its softmax.
//
// Measured on the 2-core dev box (2026-12-06, default model, a 9-node verify of 25 ms): torch's
// argmax walked each 49,152-wide row at ~1.8 ns an element (0.78 ms a verify, 71 us a decode
// step); the compaction was an index_select and an index_copy_ per pool, 61 of each (~0.6 ms);
// the drafter's softmax then topk over its 16,384 hot tokens ~0.13 ms a search step.
//
// argmax_rows and compact_rows give torch's results exactly (ids; bytes). softmax_topk's
// probabilities may differ from torch's softmax in the last bits (its own exp): it serves the
// drafter only, whose numerics never reach the output.
#pragma once
#include "tensor_api.h"
#include <cstring>
#include <limits>
#include <vector>

#include "check.h"
#include "vector_math.h"

namespace round_ops {

using simd::LANES;
constexpr int64_t GRAIN_ROWS = 4;  // rows a thread takes at least (a row is ~5 us)

// The first index of x's maximum, NaN counting as the maximum (torch.argmax's rule).
inline int64_t argmax_row(const float* x, int64_t n) {
  simd::vec best = simd::set1(-std::numeric_limits<float>::infinity());
  simd::mask nan = 0;
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES) {
    const simd::vec v = simd::loadu(x + i);
    nan |= simd::unordered(v, v);
    best = simd::max(best, v);
  }
  float top = simd::reduce_max(best);
  bool any_nan = nan != 0;
  for (int64_t j = i; j < n; ++j) {
    any_nan = any_nan || x[j] != x[j];
    top = x[j] > top ? x[j] : top;
  }
  const simd::vec wanted = simd::set1(top);
  for (i = 0; i + LANES <= n; i += LANES) {  // the first NaN, else the first lane at the maximum
    const simd::vec v = simd::loadu(x + i);
    const simd::mask hit = any_nan ? simd::unordered(v, v) : simd::equal(v, wanted);
    if (hit) return i + __builtin_ctz(hit);
  }
  for (; i < n; ++i)
    if (any_nan ? x[i] != x[i] : x[i] == top) return i;
  return 0;  // not reached: some element is the maximum
}

// logits [R, V] fp32 -> [R] int64.
at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat,
              "argmax_rows takes float32 logits [R, V]");
  TORCH_CHECK(logits.size(1) > 0, "argmax_rows: rows must not be empty");
  const auto x = logits.contiguous();
  const int64_t rows = x.size(0), n = x.size(1);
  auto out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* src = x.data_ptr<float>();
  int64_t* ids = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, GRAIN_ROWS, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) ids[r] = argmax_row(src + r * n, n);
  });
  return out;
}

// Row src[i] of every pool to row dst[i], all sources read before any row is written (moves
// may overlap); every index is checked before anything moves. Pools: contiguous, rows on dim 0.
void compact_rows(const std::vector<at::Tensor>& pools, const at::Tensor& src,
                  const at::Tensor& dst) {
  TORCH_CHECK(src.dim() == 1 && dst.dim() == 1 && src.numel() == dst.numel() &&
                  src.scalar_type() == at::kLong && dst.scalar_type() == at::kLong,
              "compact_rows: src and dst must be int64 vectors of one length");
  const auto from = src.contiguous(), to = dst.contiguous();
  const int64_t moves = from.numel();
  const int64_t* s = from.data_ptr<int64_t>();
  const int64_t* d = to.data_ptr<int64_t>();
  for (const auto& pool : pools) {
    TORCH_CHECK(pool.device().is_cpu() && pool.is_contiguous() && pool.dim() >= 1,
                "compact_rows: pools must be contiguous CPU tensors");
    for (int64_t i = 0; i < moves; ++i)
      KERNEL_CHECK(s[i] >= 0 && s[i] < pool.size(0) && d[i] >= 0 && d[i] < pool.size(0),
                   "compact_rows: a slot lies outside a pool of %lld rows",
                   static_cast<long long>(pool.size(0)));
  }
  std::vector<char> held;
  for (const auto& pool : pools) {
    const int64_t row_bytes = pool.numel() / pool.size(0) * pool.element_size();
    char* base = static_cast<char*>(pool.data_ptr());
    held.resize(static_cast<size_t>(moves * row_bytes));
    for (int64_t i = 0; i < moves; ++i)
      std::memcpy(held.data() + i * row_bytes, base + s[i] * row_bytes, row_bytes);
    for (int64_t i = 0; i < moves; ++i)
      std::memcpy(base + d[i] * row_bytes, held.data() + i * row_bytes, row_bytes);
  }
}

// The k largest of x into top / at, descending; of equal values the lower index comes first.
inline void top_k_row(const float* x, int64_t n, int64_t k, float* top, int64_t* at) {
  int64_t filled = 0;
  auto insert = [&](float value, int64_t index) {  // once full, the last entry drops out
    int64_t j = filled < k ? filled++ : k - 1;
    for (; j > 0 && value > top[j - 1]; --j) {
      top[j] = top[j - 1];
      at[j] = at[j - 1];
    }
    top[j] = value;
    at[j] = index;
  };
  int64_t i = 0;
  for (; i < n && filled < k; ++i) insert(x[i], i);
  for (; i + LANES <= n; i += LANES) {  // most vectors hold no lane above the k-th value
    simd::mask above = simd::greater(simd::loadu(x + i), simd::set1(top[k - 1]));
    for (; above; above &= above - 1) {
      const int64_t j = i + __builtin_ctz(above);
      if (x[j] > top[k - 1]) insert(x[j], j);  // an earlier lane may have raised the bar
    }
  }
  for (; i < n; ++i)
    if (x[i] > top[k - 1]) insert(x[i], i);
}

// softmax(x)'s k largest entries: the top k of x (the first is the row's maximum), then the
// sum of exp(x - maximum) over the row.
inline void softmax_topk_row(const float* x, int64_t n, int64_t k, float* probs, int64_t* ids) {
  top_k_row(x, n, k, probs, ids);
  const float top = probs[0];
  simd::vec sum = simd::zero();
  const simd::vec shift = simd::set1(top);
  for (int64_t i = 0; i < n; i += LANES) {
    const simd::mask lanes = simd::lanes_below(i, n);
    const simd::vec v = simd::maskz_loadu(lanes, x + i);
    sum = simd::add(sum, simd::maskz_mov(lanes, vmath::exp(simd::sub(v, shift))));
  }
  const float total = simd::reduce_add(sum);
  for (int64_t j = 0; j < k; ++j) {
    const simd::vec e = vmath::exp(simd::set1(probs[j] - top));
    probs[j] = simd::first_lane(e) / total;
  }
}

// logits [R, V] fp32, 1 <= k <= V -> (probabilities [R, k] fp32, ids [R, k] int64), descending.
std::tuple<at::Tensor, at::Tensor> softmax_topk(const at::Tensor& logits, int64_t k) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat,
              "softmax_topk takes float32 logits [R, V]");
  TORCH_CHECK(k >= 1 && k <= logits.size(1), "softmax_topk: k must be in 1..V");
  const auto x = logits.contiguous();
  const int64_t rows = x.size(0), n = x.size(1);
  auto probs = at::empty({rows, k}, x.options());
  auto ids = at::empty({rows, k}, x.options().dtype(at::kLong));
  const float* src = x.data_ptr<float>();
  float* p = probs.data_ptr<float>();
  int64_t* at_ids = ids.data_ptr<int64_t>();
  at::parallel_for(0, rows, GRAIN_ROWS, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      softmax_topk_row(src + r * n, n, k, p + r * k, at_ids + r * k);
  });
  return {probs, ids};
}

}  // namespace round_ops
