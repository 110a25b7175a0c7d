// Small vector helpers for the CPU attention (exact_attention.h) and the round ops: the sums of
// 16 vectors at once, and exp, on kernels/simd16.h's 16-lane vectors. Each result is a fixed
// function of its inputs (a fixed summation tree, a fixed polynomial), which is what lets a
// token's attention have the same bits in every kind of step.
#pragma once
#include "simd16.h"

namespace vmath {

using simd::LANES;
using simd::lanes_below;
using simd::vec;

// Lane r of the result is the sum of v[r]'s 16 lanes, by the same balanced tree for every r
// ((l0 + l1) + (l2 + l3)) + ...: four rounds of pair sums, each halving the vectors. Written out
// with constant indices so that the 16 inputs can stay in registers.
inline vec sum16(const vec* v) {
  using simd::pair_sums;
  const vec a0 = pair_sums(v[0], v[1]), a1 = pair_sums(v[2], v[3]);
  const vec a2 = pair_sums(v[4], v[5]), a3 = pair_sums(v[6], v[7]);
  const vec a4 = pair_sums(v[8], v[9]), a5 = pair_sums(v[10], v[11]);
  const vec a6 = pair_sums(v[12], v[13]), a7 = pair_sums(v[14], v[15]);
  const vec b0 = pair_sums(a0, a1), b1 = pair_sums(a2, a3);
  const vec b2 = pair_sums(a4, a5), b3 = pair_sums(a6, a7);
  return pair_sums(pair_sums(b0, b1), pair_sums(b2, b3));
}

inline float sum_lanes(vec v) { return simd::reduce_add(v); }

// exp(x) to about 1 ulp (Cody-Waite reduction by ln 2, then a degree-7 polynomial); 0 below
// -87.3, where float's exp leaves the normal range.
inline vec exp(vec x) {
  using namespace simd;
  const vec low = set1(-87.33654f);
  const mask underflow = less(x, low);
  x = min(max(x, low), set1(88.37626f));
  const vec n = round_nearest(mul(x, set1(1.44269504088896341f)));
  vec r = fnmadd(n, set1(0.693359375f), x);
  r = fnmadd(n, set1(-2.12194440e-4f), r);
  vec p = set1(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                        5.0000001201e-1f})
    p = fmadd(p, r, set1(c));
  p = fmadd(mul(p, r), r, add(r, set1(1.0f)));
  return maskz_mov(static_cast<mask>(~underflow), scale_by_power_of_two(p, n));
}

}  // namespace vmath
