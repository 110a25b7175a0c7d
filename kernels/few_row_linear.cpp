// y = x @ w.T for 1..16 rows of x (a verify step's tree), fp32, AVX-512.
//
// Why: with so few rows a linear layer streams its whole weight from memory for very little
// arithmetic. On 2 cores MKL's packed sgemm took ~1.8 ms per layer of the default model at 16
// rows against ~0.9 ms for a 1-row step, about its compute time plus its memory time. This
// kernel prefetches the weight stream ahead of the multiply-adds so that the two overlap more.
//
// Layout: the weight is packed once as [N / 16][K][16] (16 output columns per block, one
// 64-byte line per k), so each block is one contiguous stream. Each output row accumulates over
// K in chunks of CHUNK (a fresh register sum per chunk, added to the running total), which keeps
// the rounding error below that of a single K-long sum.
#include <ATen/Parallel.h>
#include <array>
#include <utility>
#include <vector>
#include <immintrin.h>
#include <ATen/ATen.h>
// pybind11 with torch's Tensor casters: half the compile time of torch/extension.h
#include <torch/csrc/utils/pybind.h>

#include "exact_attention.h"  // the CPU paged attention (the target's --exact mode)

namespace {

constexpr int64_t BLOCK = 16;          // output columns per block: one zmm register
constexpr int64_t MAX_ROWS = 16;
constexpr int64_t CHUNK = 64;          // k steps per partial sum
// How far ahead of the multiply-adds the weight stream is requested: into L2 far ahead, into
// L1 shortly before use (on a 2-core Xeon 6-10% faster than one L1 prefetch 32 lines ahead).
constexpr int64_t PREFETCH_L1_LINES = 16;
constexpr int64_t PREFETCH_L2_LINES = 64;

// Rows 0..M-1 of one output block. xt: x transposed to [K][MAX_ROWS].
template <int M>
void one_block(const float* xt, const float* block, float* out, int64_t k_len, int64_t n_len) {
  alignas(64) float total[M][BLOCK] = {};
  for (int64_t k0 = 0; k0 < k_len; k0 += CHUNK) {
    const int64_t k1 = std::min(k0 + CHUNK, k_len);
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; ++k) {
      _mm_prefetch(reinterpret_cast<const char*>(block + (k + PREFETCH_L1_LINES) * BLOCK),
                   _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(block + (k + PREFETCH_L2_LINES) * BLOCK),
                   _MM_HINT_T1);
      const __m512 w = _mm512_loadu_ps(block + k * BLOCK);
      const float* x = xt + k * MAX_ROWS;
      for (int m = 0; m < M; ++m) acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(x[m]), w, acc[m]);
    }
    for (int m = 0; m < M; ++m)
      _mm512_store_ps(total[m], _mm512_add_ps(_mm512_load_ps(total[m]), acc[m]));
  }
  for (int m = 0; m < M; ++m) _mm512_storeu_ps(out + m * n_len, _mm512_load_ps(total[m]));
}

template <int M>
void all_blocks(const float* xt, const float* packed, float* out, int64_t k_len, int64_t n_len) {
  at::parallel_for(0, n_len / BLOCK, 2, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      one_block<M>(xt, packed + b * k_len * BLOCK, out + b * BLOCK, k_len, n_len);
  });
}

using Kernel = void (*)(const float*, const float*, float*, int64_t, int64_t);

template <int... Ms>
constexpr std::array<Kernel, sizeof...(Ms)> kernels(std::integer_sequence<int, Ms...>) {
  return {&all_blocks<Ms + 1>...};
}

}  // namespace

at::Tensor pack(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat,
              "pack: weight must be a 2-D float32 tensor");
  TORCH_CHECK(weight.size(0) % BLOCK == 0, "pack: output features must be a multiple of 16");
  const int64_t n = weight.size(0), k = weight.size(1);
  return weight.contiguous().view({n / BLOCK, BLOCK, k}).transpose(1, 2).contiguous();
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be 2-D float32");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == BLOCK && packed.is_contiguous() &&
                  packed.scalar_type() == at::kFloat,
              "packed must come from pack()");
  const int64_t rows = x.size(0), k_len = x.size(1), n_len = packed.size(0) * BLOCK;
  TORCH_CHECK(rows >= 1 && rows <= MAX_ROWS, "x must have 1 to 16 rows");
  TORCH_CHECK(packed.size(1) == k_len, "x and packed disagree on in_features");
  // x transposed to [K][16] (rows past x's own are never read), in a buffer kept per thread.
  thread_local std::vector<float> xt;
  xt.resize(k_len * MAX_ROWS);
  const auto xc = x.contiguous();
  const float* src = xc.data_ptr<float>();
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t k = 0; k < k_len; ++k) xt[k * MAX_ROWS + m] = src[m * k_len + k];
  auto out = at::empty({rows, n_len}, x.options());
  static const auto table = kernels(std::make_integer_sequence<int, MAX_ROWS>{});
  table[rows - 1](xt.data(), packed.data_ptr<float>(), out.data_ptr<float>(), k_len, n_len);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("pack", &pack, "weight [N, K] -> [N / 16, K, 16]");
  module.def("linear", &linear, "x [rows <= 16, K] @ weight.T from the packed weight");
  module.def("attention", &exact::attention, "paged attention, fp32 (kernels/paged_reference.py)");
}
