// y = x @ w.T for 1..16 rows of x (a verify step's tree), fp32 rows, on simd16.h's 16-lane
// vectors (AVX-512, or AVX2); the weight packed in fp32, in bf16 (drafters: half the bytes a
// step streams, widened to fp32 as it is read), or as the Q4_1 / Q8_0 blocks its values came
// from (quantized_weights.h: the fp32 copy's bits).
//
// Why: with so few rows a linear layer streams its whole weight from memory for very little
// arithmetic. On 2 cores MKL's packed sgemm took ~1.8 ms per layer of the default model at 16
// rows against ~0.9 ms for a 1-row step, about its compute time plus its memory time. This
// kernel prefetches the weight stream ahead of the multiply-adds so that the two overlap more.
//
// Layout: the weight is packed once as [N / 16][K][16] (16 output columns per block, one
// 64-byte line per k in fp32, half of one in bf16; quantized copies: quantized_weights.h), so
// each block is one contiguous stream.
// Each output row accumulates over K in chunks of CHUNK (a fresh register sum per chunk, added
// to the running total), which keeps the rounding error below that of a single K-long sum.
#include "tensor_api.h"
#include <algorithm>
#include <array>
#include <utility>
#include <vector>
#include <immintrin.h>  // _mm_prefetch
#include "exports.h"

#include "simd16.h"
#include "exact_attention.h"  // the CPU paged attention (the target's default on CPU in fp32)
#include "quantized_search.h"  // finds a weight's Q4_1 or Q8_0 blocks (quantized_weights.h)
#include "round_ops.h"  // argmax, the accepted path's move, the drafter's softmax top-k
#include "row_ops.h"  // RMSNorm and rotary of a step's rows, one call each

namespace {

constexpr int64_t BLOCK = 16;          // output columns per block: one simd::vec
constexpr int64_t MAX_ROWS = 16;
constexpr int64_t CHUNK = 64;          // k steps per partial sum

// How far ahead of the multiply-adds the weight stream is requested: into L2 far ahead, into
// L1 shortly before use (on a 2-core Xeon 6-10% faster than one L1 prefetch 32 lines ahead).
constexpr int64_t PREFETCH_L1_BYTES = 16 * 64;
constexpr int64_t PREFETCH_L2_BYTES = 64 * 64;

// The 16 weights of one k: fp32 as stored; bf16 widened (its bits are an fp32's upper half).
inline simd::vec load16(const float* w) { return simd::loadu(w); }
inline simd::vec load16(const uint16_t* w) { return simd::from_bf16(w); }

// Rows of x one pass over a chunk takes, their sums held in registers beside four for the
// weights and x: all 16 with AVX-512's 32 registers; with AVX2's 16, six, and further passes
// over the same chunk of weights (from L1) take the rest. 16 rows at once spilled the sums to
// memory and ran slower than MKL (2026-12-07, 2-core AMD EPYC without AVX-512).
constexpr int ROWS_PER_PASS =
    std::min<int>(MAX_ROWS, (simd::VECTOR_REGISTERS - 4) / simd::REGISTERS_PER_VEC);

// Rows R..R+P-1's sums over k0..k1-1, w holding those k's weights ([k1 - k0][16]), each in k
// order from zero, added to the row's total: the one-pass kernels' arithmetic exactly.
template <int R, int P, bool Fetch, typename W>
inline void chunk_rows(const float* xt, const W* w, int64_t k0, int64_t k1, float (*total)[BLOCK]) {
  simd::vec acc[P];
  for (int m = 0; m < P; ++m) acc[m] = simd::zero();
  for (int64_t k = k0; k < k1; ++k) {
    if constexpr (Fetch && R == 0) {  // the first pass brings the weights in
      const char* here = reinterpret_cast<const char*>(w + (k - k0) * BLOCK);
      _mm_prefetch(here + PREFETCH_L1_BYTES, _MM_HINT_T0);
      _mm_prefetch(here + PREFETCH_L2_BYTES, _MM_HINT_T1);
    }
    const simd::vec wk = load16(w + (k - k0) * BLOCK);
    const float* x = xt + k * MAX_ROWS + R;
    for (int m = 0; m < P; ++m) acc[m] = simd::fmadd(simd::set1(x[m]), wk, acc[m]);
  }
  for (int m = 0; m < P; ++m)
    simd::store(total[R + m], simd::add(simd::load(total[R + m]), acc[m]));
}

template <int R, int M, bool Fetch, typename W>
inline void chunk_in_passes(const float* xt, const W* w, int64_t k0, int64_t k1,
                            float (*total)[BLOCK]) {
  constexpr int P = std::min(M - R, ROWS_PER_PASS);
  chunk_rows<R, P, Fetch>(xt, w, k0, k1, total);
  if constexpr (R + P < M) chunk_in_passes<R + P, M, Fetch>(xt, w, k0, k1, total);
}

// Rows 0..M-1 of one output block. xt: x transposed to [K][MAX_ROWS].
template <int M, typename W>
void one_block(const float* xt, const W* block, float* out, int64_t k_len, int64_t n_len) {
  alignas(64) float total[M][BLOCK] = {};
  for (int64_t k0 = 0; k0 < k_len; k0 += CHUNK) {
    const int64_t k1 = std::min(k0 + CHUNK, k_len);
    chunk_in_passes<0, M, true>(xt, block + k0 * BLOCK, k0, k1, total);
  }
  for (int m = 0; m < M; ++m) simd::storeu(out + m * n_len, simd::load(total[m]));
}

// Each pair of k in k0..k1-1 (k0 even) with its 16 columns' weights rebuilt from the quantized
// groups (quantized_weights.h) in registers, in k order, the stream prefetched ahead.
template <typename Format, typename Use>
inline void rebuilt_pairs(const uint8_t* block, int64_t k0, int64_t k1, Use use) {
  constexpr int64_t PAIR_BYTES = Format::BYTES / (quantized::GROUP / 2);
  for (int64_t g0 = k0; g0 < k1; g0 += quantized::GROUP) {
    const uint8_t* group = block + (g0 / quantized::GROUP) * Format::BYTES;
    const Format weights(group);
    for (int64_t j = 0; j < quantized::GROUP / 2; ++j) {
      const char* here = reinterpret_cast<const char*>(group) + j * PAIR_BYTES;
      _mm_prefetch(here + PREFETCH_L1_BYTES, _MM_HINT_T0);
      _mm_prefetch(here + PREFETCH_L2_BYTES, _MM_HINT_T1);
      simd::vec even, odd;
      weights.pair(j, even, odd);
      use(g0 + 2 * j, even, odd);
    }
  }
}

// The same from quantized groups: the fp32 kernel's multiply-adds in its order, on the very
// weights it would read, rebuilt in registers.
template <int M, typename Format>
void one_quantized_block(const float* xt, const uint8_t* block, float* out, int64_t k_len,
                         int64_t n_len) {
  alignas(64) float total[M][BLOCK] = {};
  for (int64_t k0 = 0; k0 < k_len; k0 += CHUNK) {
    simd::vec acc[M];
    for (int m = 0; m < M; ++m) acc[m] = simd::zero();
    rebuilt_pairs<Format>(block, k0, std::min(k0 + CHUNK, k_len),
                          [&](int64_t k, simd::vec even, simd::vec odd) {
      const float* x = xt + k * MAX_ROWS;
      for (int m = 0; m < M; ++m) acc[m] = simd::fmadd(simd::set1(x[m]), even, acc[m]);
      x += MAX_ROWS;
      for (int m = 0; m < M; ++m) acc[m] = simd::fmadd(simd::set1(x[m]), odd, acc[m]);
    });
    for (int m = 0; m < M; ++m)
      simd::store(total[m], simd::add(simd::load(total[m]), acc[m]));
  }
  for (int m = 0; m < M; ++m) simd::storeu(out + m * n_len, simd::load(total[m]));
}

// More rows than one pass holds (AVX2): each chunk's weights are rebuilt once, into an fp32
// buffer in L1, and every pass reads them there. Rebuilt in every pass instead, all of the
// default model's linear layers took 14% longer at 8 rows, 33% at 16 (2026-12-07, 2-core EPYC).
template <int M, typename Format>
void one_quantized_block_in_passes(const float* xt, const uint8_t* block, float* out,
                                   int64_t k_len, int64_t n_len) {
  alignas(64) float total[M][BLOCK] = {};
  alignas(64) float rebuilt[CHUNK][BLOCK];
  for (int64_t k0 = 0; k0 < k_len; k0 += CHUNK) {
    const int64_t k1 = std::min(k0 + CHUNK, k_len);
    rebuilt_pairs<Format>(block, k0, k1, [&](int64_t k, simd::vec even, simd::vec odd) {
      simd::store(rebuilt[k - k0], even);
      simd::store(rebuilt[k - k0 + 1], odd);
    });
    chunk_in_passes<0, M, false>(xt, &rebuilt[0][0], k0, k1, total);
  }
  for (int m = 0; m < M; ++m) simd::storeu(out + m * n_len, simd::load(total[m]));
}

template <int M, typename Format>
void all_quantized_blocks(const float* xt, const uint8_t* packed, float* out, int64_t k_len,
                          int64_t n_len) {
  const int64_t block_bytes = k_len / quantized::GROUP * Format::BYTES;
  at::parallel_for(0, n_len / BLOCK, 2, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      if constexpr (M <= ROWS_PER_PASS)
        one_quantized_block<M, Format>(xt, packed + b * block_bytes, out + b * BLOCK, k_len,
                                       n_len);
      else
        one_quantized_block_in_passes<M, Format>(xt, packed + b * block_bytes, out + b * BLOCK,
                                                 k_len, n_len);
  });
}

template <int M, typename W>
void all_blocks(const float* xt, const W* packed, float* out, int64_t k_len, int64_t n_len) {
  at::parallel_for(0, n_len / BLOCK, 2, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      one_block<M>(xt, packed + b * k_len * BLOCK, out + b * BLOCK, k_len, n_len);
  });
}

template <typename W>
using Kernel = void (*)(const float*, const W*, float*, int64_t, int64_t);

template <typename W, int... Ms>
constexpr std::array<Kernel<W>, sizeof...(Ms)> kernels(std::integer_sequence<int, Ms...>) {
  return {&all_blocks<Ms + 1, W>...};
}

template <typename Format, int... Ms>
constexpr std::array<Kernel<uint8_t>, sizeof...(Ms)> quantized_kernels(
    std::integer_sequence<int, Ms...>) {
  return {&all_quantized_blocks<Ms + 1, Format>...};
}

template <typename Format>
void run_quantized(const float* xt, const uint8_t* packed, float* out, int64_t rows, int64_t k_len,
                   int64_t n_len) {
  static const auto table = quantized_kernels<Format>(std::make_integer_sequence<int, MAX_ROWS>{});
  table[rows - 1](xt, packed, out, k_len, n_len);
}

template <typename W>
void run(const float* xt, const W* packed, float* out, int64_t rows, int64_t k_len, int64_t n_len) {
  static const auto table = kernels<W>(std::make_integer_sequence<int, MAX_ROWS>{});
  table[rows - 1](xt, packed, out, k_len, n_len);
}

}  // namespace

at::Tensor pack(const at::Tensor& weight) {
  const auto type = weight.scalar_type();
  TORCH_CHECK(weight.dim() == 2 && (type == at::kFloat || type == at::kBFloat16),
              "pack: weight must be a 2-D float32 or bfloat16 tensor");
  TORCH_CHECK(weight.size(0) % BLOCK == 0, "pack: output features must be a multiple of 16");
  const int64_t n = weight.size(0), k = weight.size(1);
  return weight.contiguous().view({n / BLOCK, BLOCK, k}).transpose(1, 2).contiguous();
}

// A packed copy's in_features: fp32 and bf16 copies are [N / 16][K][16]; quantized ones
// [N / 16][K / 32][group bytes] uint8 (quantized_weights.h); 0 for anything else.
int64_t packed_in_features(const at::Tensor& packed) {
  if (packed.dim() != 3 || !packed.is_contiguous()) return 0;
  const auto type = packed.scalar_type();
  if ((type == at::kFloat || type == at::kBFloat16) && packed.size(2) == BLOCK)
    return packed.size(1);
  const int64_t bytes = packed.size(2);
  if (type == at::kByte && (bytes == quantized::Q4_1::BYTES || bytes == quantized::Q8_0::BYTES))
    return packed.size(1) * quantized::GROUP;
  return 0;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be 2-D float32");
  const auto type = packed.scalar_type();
  TORCH_CHECK(packed_in_features(packed) > 0, "packed must come from pack() or quantized_pack.py");
  const int64_t rows = x.size(0), k_len = x.size(1), n_len = packed.size(0) * BLOCK;
  TORCH_CHECK(rows >= 1 && rows <= MAX_ROWS, "x must have 1 to 16 rows");
  TORCH_CHECK(packed_in_features(packed) == k_len, "x and packed disagree on in_features");
  // x transposed to [K][16] (rows past x's own are never read), in a buffer kept per thread.
  thread_local std::vector<float> xt;
  xt.resize(k_len * MAX_ROWS);
  const auto xc = x.contiguous();
  const float* src = xc.data_ptr<float>();
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t k = 0; k < k_len; ++k) xt[k * MAX_ROWS + m] = src[m * k_len + k];
  auto out = at::empty({rows, n_len}, x.options());
  float* dst = out.data_ptr<float>();
  if (type == at::kFloat) {
    run(xt.data(), packed.data_ptr<float>(), dst, rows, k_len, n_len);
  } else if (type == at::kBFloat16) {
    run(xt.data(), reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>()), dst, rows,
        k_len, n_len);
  } else if (packed.size(2) == quantized::Q4_1::BYTES) {
    run_quantized<quantized::Q4_1>(xt.data(), packed.data_ptr<uint8_t>(), dst, rows, k_len, n_len);
  } else {
    run_quantized<quantized::Q8_0>(xt.data(), packed.data_ptr<uint8_t>(), dst, rows, k_len, n_len);
  }
  return out;
}

int64_t rows_per_pass() { return ROWS_PER_PASS; }

std::tuple<int64_t, int64_t, int64_t> group_bytes() {
  return {quantized::GROUP, quantized::Q4_1::BYTES, quantized::Q8_0::BYTES};
}
