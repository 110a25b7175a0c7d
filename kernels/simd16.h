// The CPU kernels' one vector type: 16 fp32 lanes, and a 16-bit mask of lanes. With AVX-512 it
// is one zmm register; with AVX2 (plus FMA and F16C) two ymm registers, lanes 0-7 and 8-15.
//
// Why one type for both: the kernels (the few-row linear, the paged attention, the row and
// round ops) were written for 16 lanes, and on a CPU without AVX-512 (AMD before Zen 4, many
// cloud and desktop Intel parts) they used not to build at all, leaving torch's kernels, which
// are several times slower on those steps (docs/cpu.md). Every operation here is lane-wise, or
// a fixed tree across lanes that the AVX2 build copies from GCC's AVX-512 one, so a kernel
// computes the same bits in either build.
#pragma once
#include <cstdint>
#include <immintrin.h>

namespace simd {

constexpr int64_t LANES = 16;

#if defined(__AVX512F__)

using vec = __m512;
using mask = __mmask16;
constexpr int REGISTERS_PER_VEC = 1;  // of the ISA's 32 vector registers
constexpr int VECTOR_REGISTERS = 32;

inline vec zero() { return _mm512_setzero_ps(); }
inline vec set1(float x) { return _mm512_set1_ps(x); }
inline vec loadu(const float* p) { return _mm512_loadu_ps(p); }
inline vec load(const float* p) { return _mm512_load_ps(p); }
inline void storeu(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline void store(float* p, vec v) { _mm512_store_ps(p, v); }
inline vec maskz_loadu(mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
inline vec mask_loadu(vec src, mask m, const float* p) { return _mm512_mask_loadu_ps(src, m, p); }
inline void mask_storeu(float* p, mask m, vec v) { _mm512_mask_storeu_ps(p, m, v); }
inline vec maskz_mov(mask m, vec v) { return _mm512_maskz_mov_ps(m, v); }

inline vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
inline vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
inline vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
inline vec div(vec a, vec b) { return _mm512_div_ps(a, b); }
inline vec max(vec a, vec b) { return _mm512_max_ps(a, b); }
inline vec min(vec a, vec b) { return _mm512_min_ps(a, b); }
inline vec fmadd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }    // a * b + c
inline vec fnmadd(vec a, vec b, vec c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b

inline mask unordered(vec a, vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q); }
inline mask equal(vec a, vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
inline mask greater(vec a, vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
inline mask less(vec a, vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }

inline float reduce_add(vec v) { return _mm512_reduce_add_ps(v); }
inline float reduce_max(vec v) { return _mm512_reduce_max_ps(v); }
inline float first_lane(vec v) { return _mm512_cvtss_f32(v); }

// Lane k: x's lanes 2k and 2k + 1 added for k < 8, y's lanes 2(k - 8) and 2(k - 8) + 1 after.
inline vec pair_sums(vec x, vec y) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_add_ps(_mm512_permutex2var_ps(x, even, y), _mm512_permutex2var_ps(x, odd, y));
}

inline vec round_nearest(vec x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// p * 2^n for integral n, rounded once.
inline vec scale_by_power_of_two(vec p, vec n) { return _mm512_scalef_ps(p, n); }

// 16 fp16 / bf16 values widened to fp32 (a bf16's bits are an fp32's upper half).
inline vec from_fp16(const void* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
}
inline vec from_bf16(const void* p) {
  const __m256i raw = _mm256_loadu_si256(static_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
// 16 bytes as unsigned / signed integers, in fp32.
inline vec from_u8(__m128i bytes) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)); }
inline vec from_i8(__m128i bytes) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)); }

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

struct vec {
  __m256 lo, hi;
};
using mask = uint16_t;
constexpr int REGISTERS_PER_VEC = 2;  // of the ISA's 16 vector registers
constexpr int VECTOR_REGISTERS = 16;

namespace detail {
// Eight lanes' bits of m as a ymm mask (all ones where set), for maskload, blend and and.
inline __m256i lanes(unsigned bits) {
  const __m256i each = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), each),
                            each);
}
inline __m256i low_lanes(mask m) { return lanes(m & 0xFFu); }
inline __m256i high_lanes(mask m) { return lanes(static_cast<unsigned>(m) >> 8); }
template <int Predicate>
inline mask compare(vec a, vec b) {
  const int low = _mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, Predicate));
  const int high = _mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, Predicate));
  return static_cast<mask>(low | (high << 8));
}
// 2^e for integral e in -126..127, built from its exponent bits.
inline __m256 power_of_two(__m256i e) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
}
// p * 2^n in two exact-then-rounded steps: n splits into halves (each within the exponent's
// range), p * 2^(n/2) is exact for the |p| of about 1 that exp gives, and the second product
// rounds once, as AVX-512's scalef does.
inline __m256 scale_half(__m256 p, __m256 n) {
  const __m256i e = _mm256_cvtps_epi32(n);
  const __m256i first = _mm256_srai_epi32(e, 1);
  const __m256i second = _mm256_sub_epi32(e, first);
  return _mm256_mul_ps(_mm256_mul_ps(p, power_of_two(first)), power_of_two(second));
}
// Lanes 0-3: pairs (0,1), (2,3) of a then of b; lanes 4-7 likewise from a's and b's upper
// halves (hadd's order) -> a's four pair sums, then b's.
inline __m256 pair_sums8(__m256 a, __m256 b) {
  const __m256d pairs = _mm256_castps_pd(_mm256_hadd_ps(a, b));
  return _mm256_castpd_ps(_mm256_permute4x64_pd(pairs, _MM_SHUFFLE(3, 1, 2, 0)));
}
}  // namespace detail

inline vec zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline vec set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline vec loadu(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline vec load(const float* p) { return {_mm256_load_ps(p), _mm256_load_ps(p + 8)}; }
inline void storeu(float* p, vec v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
inline void store(float* p, vec v) {
  _mm256_store_ps(p, v.lo);
  _mm256_store_ps(p + 8, v.hi);
}
// Masked lanes are neither read nor written (maskload / maskstore do not fault on them).
inline vec maskz_loadu(mask m, const float* p) {
  return {_mm256_maskload_ps(p, detail::low_lanes(m)),
          _mm256_maskload_ps(p + 8, detail::high_lanes(m))};
}
inline vec mask_loadu(vec src, mask m, const float* p) {
  const vec loaded = maskz_loadu(m, p);
  return {_mm256_blendv_ps(src.lo, loaded.lo, _mm256_castsi256_ps(detail::low_lanes(m))),
          _mm256_blendv_ps(src.hi, loaded.hi, _mm256_castsi256_ps(detail::high_lanes(m)))};
}
inline void mask_storeu(float* p, mask m, vec v) {
  _mm256_maskstore_ps(p, detail::low_lanes(m), v.lo);
  _mm256_maskstore_ps(p + 8, detail::high_lanes(m), v.hi);
}
inline vec maskz_mov(mask m, vec v) {
  return {_mm256_and_ps(v.lo, _mm256_castsi256_ps(detail::low_lanes(m))),
          _mm256_and_ps(v.hi, _mm256_castsi256_ps(detail::high_lanes(m)))};
}

inline vec add(vec a, vec b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline vec sub(vec a, vec b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline vec mul(vec a, vec b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline vec div(vec a, vec b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline vec max(vec a, vec b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline vec min(vec a, vec b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline vec fmadd(vec a, vec b, vec c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline vec fnmadd(vec a, vec b, vec c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}

inline mask unordered(vec a, vec b) { return detail::compare<_CMP_UNORD_Q>(a, b); }
inline mask equal(vec a, vec b) { return detail::compare<_CMP_EQ_OQ>(a, b); }
inline mask greater(vec a, vec b) { return detail::compare<_CMP_GT_OQ>(a, b); }
inline mask less(vec a, vec b) { return detail::compare<_CMP_LT_OQ>(a, b); }

// GCC's _mm512_reduce_add_ps tree: the two halves, their two quarters, then pairs.
inline float reduce_add(vec v) {
  const __m256 eight = _mm256_add_ps(v.hi, v.lo);
  const __m128 four = _mm_add_ps(_mm256_extractf128_ps(eight, 1), _mm256_castps256_ps128(eight));
  const __m128 two = _mm_add_ps(four, _mm_shuffle_ps(four, four, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(two) + _mm_cvtss_f32(_mm_shuffle_ps(two, two, _MM_SHUFFLE(1, 1, 1, 1)));
}
inline float reduce_max(vec v) {  // likewise, with max_ps's operand order (signed zeros)
  const __m256 eight = _mm256_max_ps(v.hi, v.lo);
  const __m128 four = _mm_max_ps(_mm256_extractf128_ps(eight, 1), _mm256_castps256_ps128(eight));
  const __m128 two = _mm_max_ps(four, _mm_shuffle_ps(four, four, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(_mm_max_ps(two, _mm_shuffle_ps(two, two, _MM_SHUFFLE(0, 1, 0, 1))));
}
inline float first_lane(vec v) { return _mm256_cvtss_f32(v.lo); }

inline vec pair_sums(vec x, vec y) {
  return {detail::pair_sums8(x.lo, x.hi), detail::pair_sums8(y.lo, y.hi)};
}

inline vec round_nearest(vec x) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(x.lo, mode), _mm256_round_ps(x.hi, mode)};
}
inline vec scale_by_power_of_two(vec p, vec n) {
  return {detail::scale_half(p.lo, n.lo), detail::scale_half(p.hi, n.hi)};
}

inline vec from_fp16(const void* p) {
  const __m128i* h = static_cast<const __m128i*>(p);
  return {_mm256_cvtph_ps(_mm_loadu_si128(h)), _mm256_cvtph_ps(_mm_loadu_si128(h + 1))};
}
inline vec from_bf16(const void* p) {
  const __m128i* h = static_cast<const __m128i*>(p);
  auto widen = [](__m128i raw) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  };
  return {widen(_mm_loadu_si128(h)), widen(_mm_loadu_si128(h + 1))};
}
inline vec from_u8(__m128i bytes) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)),
          _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)))};
}
inline vec from_i8(__m128i bytes) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)),
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)))};
}

#else
#error "the CPU kernels need AVX-512F, or AVX2 with FMA and F16C (kernels/few_row_linear.py)"
#endif

// Lanes i..i+15 that lie below n (a masked tail where n is not a multiple of 16).
inline mask lanes_below(int64_t i, int64_t n) {
  if (n - i >= LANES) return static_cast<mask>(0xFFFF);
  return n <= i ? static_cast<mask>(0) : static_cast<mask>((1u << (n - i)) - 1u);
}

}  // namespace simd
