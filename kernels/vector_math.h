// Small AVX-512 helpers for the CPU attention (exact_attention.h): lane masks, the sums of 16
// vectors at once, and exp. Each result is a fixed function of its inputs (a fixed summation
// tree, a fixed polynomial), which is what lets a token's attention have the same bits in every
// kind of step.
#pragma once
#include <cstdint>
#include <immintrin.h>

namespace vmath {

constexpr int64_t LANES = 16;

// Lanes i..i+15 that lie below n (a masked tail where n is not a multiple of 16).
inline __mmask16 lanes_below(int64_t i, int64_t n) {
  if (n - i >= LANES) return static_cast<__mmask16>(0xFFFF);
  return n <= i ? static_cast<__mmask16>(0) : static_cast<__mmask16>((1u << (n - i)) - 1u);
}

// Lane k of the result: x's lanes 2k and 2k+1 added for k < 8, y's lanes 2(k-8), 2(k-8)+1 after.
inline __m512 pair_sums(__m512 x, __m512 y) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_add_ps(_mm512_permutex2var_ps(x, even, y), _mm512_permutex2var_ps(x, odd, y));
}

// Lane r of the result is the sum of v[r]'s 16 lanes, by the same balanced tree for every r
// ((l0 + l1) + (l2 + l3)) + ...: four rounds of pair sums, each halving the vectors. Written out
// with constant indices so that the 16 inputs can stay in registers.
inline __m512 sum16(const __m512* v) {
  const __m512 a0 = pair_sums(v[0], v[1]), a1 = pair_sums(v[2], v[3]);
  const __m512 a2 = pair_sums(v[4], v[5]), a3 = pair_sums(v[6], v[7]);
  const __m512 a4 = pair_sums(v[8], v[9]), a5 = pair_sums(v[10], v[11]);
  const __m512 a6 = pair_sums(v[12], v[13]), a7 = pair_sums(v[14], v[15]);
  const __m512 b0 = pair_sums(a0, a1), b1 = pair_sums(a2, a3);
  const __m512 b2 = pair_sums(a4, a5), b3 = pair_sums(a6, a7);
  return pair_sums(pair_sums(b0, b1), pair_sums(b2, b3));
}

inline float sum_lanes(__m512 v) { return _mm512_reduce_add_ps(v); }

// exp(x) to about 1 ulp (Cody-Waite reduction by ln 2, then a degree-7 polynomial); 0 below
// -87.3, where float's exp leaves the normal range.
inline __m512 exp(__m512 x) {
  const __m512 low = _mm512_set1_ps(-87.33654f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, low, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, low), _mm512_set1_ps(88.37626f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                        5.0000001201e-1f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), _mm512_scalef_ps(p, n));
}

}  // namespace vmath
