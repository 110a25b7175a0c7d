// Paged attention on the CPU, fp32, AVX-512: the same function as kernels/paged_reference.py.
// Included by few_row_linear.cpp, so the CPU kernels build as one translation unit (torch's
// headers, most of the build time, are compiled once).
//
// Why: torch's attention gathers a padded [B, K] context per step, and how it blocks its sums
// depends on the step's shape, so a token's output rounds differently in a 1-token decode than
// in a 16-token verify. Here each (token, head) is computed by one thread walking that token's
// own logical keys in order: scores (a 16-lane dot product per key, reduced in a fixed order),
// their max, the exponentials summed key by key, then the values weighted key by key. Nothing
// depends on the other queries of the step or on how the threads split the work, so a token gets
// the same bits in a decode, a prefill chunk or a tree verify (the target's --exact mode).
#pragma once
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>
#include <immintrin.h>
#include <ATen/ATen.h>

namespace exact {

constexpr int64_t LANES = 16;

// Lanes i..i+15 that lie below n (head dims that are not a multiple of 16 take a masked tail).
__mmask16 lanes_below(int64_t i, int64_t n) {
  return n - i >= LANES ? static_cast<__mmask16>(0xFFFF)
                        : static_cast<__mmask16>((1u << (n - i)) - 1u);
}

float dot(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += LANES) {
    const __mmask16 m = lanes_below(i, n);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

struct Keys {
  const int64_t* table_row;
  const int64_t* path;
  int64_t prefix;
  int64_t slot(int64_t j) const { return j < prefix ? table_row[j] : path[j - prefix]; }
};

void one_head(const float* q, const float* k_pool, const float* v_pool, const Keys& keys,
              int64_t num_keys, int64_t head_offset, int64_t slot_stride, int64_t dim,
              float scale, float* out, std::vector<float>& scores) {
  scores.resize(num_keys);
  float top = -INFINITY;
  for (int64_t j = 0; j < num_keys; ++j) {
    scores[j] = dot(q, k_pool + keys.slot(j) * slot_stride + head_offset, dim) * scale;
    top = std::max(top, scores[j]);
  }
  float total = 0.0f;
  for (int64_t j = 0; j < num_keys; ++j) {
    scores[j] = std::exp(scores[j] - top);
    total += scores[j];
  }
  for (int64_t i = 0; i < dim; i += LANES) {
    const __mmask16 m = lanes_below(i, dim);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < num_keys; ++j) {
      const float* v = v_pool + keys.slot(j) * slot_stride + head_offset + i;
      acc = _mm512_fmadd_ps(_mm512_set1_ps(scores[j]), _mm512_maskz_loadu_ps(m, v), acc);
    }
    _mm512_mask_storeu_ps(out + i, m, _mm512_div_ps(acc, _mm512_set1_ps(total)));
  }
}

void check(const at::Tensor& t, int64_t dims, c10::ScalarType type, const char* name) {
  TORCH_CHECK(t.dim() == dims && t.scalar_type() == type && t.is_contiguous() && !t.is_cuda(),
              name, ": expected a contiguous CPU tensor of ", dims, " dims and type ", type);
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                     const at::Tensor& table, const at::Tensor& query_row,
                     const at::Tensor& query_len, const at::Tensor& prefix_len,
                     const at::Tensor& path) {
  check(q, 3, at::kFloat, "q");
  check(k_pool, 3, at::kFloat, "k_pool");
  check(v_pool, 3, at::kFloat, "v_pool");
  check(table, 2, at::kLong, "table");
  check(path, 2, at::kLong, "path");
  for (const auto* t : {&query_row, &query_len, &prefix_len}) check(*t, 1, at::kLong, "rows");
  const int64_t tokens = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_pool.size(1), group = heads / kv_heads;
  TORCH_CHECK(heads % kv_heads == 0, "heads must be a multiple of the KV heads");
  TORCH_CHECK(v_pool.sizes() == k_pool.sizes() && k_pool.size(2) == dim, "pool shapes differ");
  auto out = at::empty_like(q);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const float *qp = q.data_ptr<float>(), *kp = k_pool.data_ptr<float>();
  const float* vp = v_pool.data_ptr<float>();
  const int64_t *rows = query_row.data_ptr<int64_t>(), *lens = query_len.data_ptr<int64_t>();
  const int64_t* prefixes = prefix_len.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, tokens * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t index = begin; index < end; ++index) {
      const int64_t t = index / heads, h = index % heads;
      const Keys keys{table.data_ptr<int64_t>() + rows[t] * table.size(1),
                      path.data_ptr<int64_t>() + t * path.size(1), prefixes[t]};
      one_head(qp + index * dim, kp, vp, keys, lens[t], (h / group) * dim, kv_heads * dim, dim,
               scale, op + index * dim, scores);
    }
  });
  return out;
}

}  // namespace exact
