// The few-row kernel's quantized weight copies: a checkpoint's own 4-bit (Q4_1) and 8-bit
// (Q8_0) blocks, recovered from the fp32 weights they dequantize to
// (model_runtime/quantized_pack.py), so a step streams 5 or 8.5 bits a weight instead of 32.
//
// Each weight is rebuilt in a register exactly as it was dequantized (Q4_1: d * q + m, whose
// product is exact in fp32, so one rounding, the same as a fused multiply-add; Q8_0: d * q,
// exact), and then multiplied in the same order as the fp32 kernel: the results have the fp32
// kernel's bits.
//
// Layout, per block of 16 output columns and group of GROUP k: the 16 columns' scales as fp16,
// then the quantized values, 16 columns a line:
//   Q4_1: d[16], m[16], then 16 lines of 16 bytes; line j holds k = 2j in its low nibbles and
//         k = 2j + 1 in its high ones.
//   Q8_0: d[16], then 32 lines of 16 int8, one per k.
#pragma once

#include <cstdint>
#include <immintrin.h>

#include "simd16.h"

namespace quantized {

constexpr int64_t GROUP = 32;  // k per quantization block (GGUF's QK4_1 and QK8_0)

struct Q4_1 {
  static constexpr int64_t BYTES = 32 + 32 + 16 * 16;
  const uint8_t* group;
  simd::vec d, m;
  explicit Q4_1(const uint8_t* g) : group(g), d(simd::from_fp16(g)), m(simd::from_fp16(g + 32)) {}
  // The weights of k = 2j and 2j + 1 of this group.
  inline void pair(int64_t j, simd::vec& even, simd::vec& odd) const {
    const __m128i line = _mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 64 + 16 * j));
    const __m128i nibble = _mm_set1_epi8(0x0F);
    const __m128i low = _mm_and_si128(line, nibble);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(line, 4), nibble);
    even = simd::fmadd(simd::from_u8(low), d, m);
    odd = simd::fmadd(simd::from_u8(high), d, m);
  }
};

struct Q8_0 {
  static constexpr int64_t BYTES = 32 + 32 * 16;
  const uint8_t* group;
  simd::vec d;
  explicit Q8_0(const uint8_t* g) : group(g), d(simd::from_fp16(g)) {}
  inline simd::vec one(int64_t k) const {
    const __m128i line = _mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 32 + 16 * k));
    return simd::mul(simd::from_i8(line), d);
  }
  inline void pair(int64_t j, simd::vec& even, simd::vec& odd) const {
    even = one(2 * j);
    odd = one(2 * j + 1);
  }
};

}  // namespace quantized
