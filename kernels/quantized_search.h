// Finds, for an fp32 weight [N, K], the Q4_1 or Q8_0 blocks that rebuild every value bit for
// bit (model_runtime/quantized_pack.py says why), and lays them out as quantized_weights.h
// reads them. One pass over the weight: the default model's 135M weights take well under a
// second on 2 cores, where the same search in torch took several.
#pragma once

#include "tensor_api.h"
#include <c10/util/Half.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "quantized_weights.h"

namespace quantized {

constexpr int64_t COLUMNS = 16;  // output columns a packed block (the kernel's BLOCK)
constexpr int ULPS[] = {0, 1, -1, 2, -2};  // fp16 neighbours of the estimated scale, tried in turn

inline uint32_t bits(float value) {
  uint32_t out;
  std::memcpy(&out, &value, sizeof out);
  return out;
}

inline c10::Half neighbour(c10::Half scale, int ulps) {
  return c10::Half(static_cast<uint16_t>(scale.x + ulps), c10::Half::from_bits());
}

// One block's scale and q (q[i] in [low, high]) such that d * q[i] (+ base, Q4_1's m) rebuilds
// v[i] exactly. Q8_0 adds no base: + 0 would turn a -0 product into +0.
template <bool WITH_BASE>
inline bool fit_block(const float* v, float estimate, float base, int low, int high,
                      c10::Half& scale, int* q) {
  const c10::Half first(estimate);
  for (int ulps : ULPS) {
    const c10::Half tried = neighbour(first, ulps);
    const float d = static_cast<float>(tried);
    if (!(d >= 0.0f)) continue;
    bool fits = true;
    for (int i = 0; i < GROUP && fits; ++i) {
      // d 0: every value is the base, or (Q8_0) a signed zero, which q -1 gives where it is -0.
      const float guess = d > 0.0f ? std::nearbyint((v[i] - base) / d) : -float(std::signbit(v[i]));
      q[i] = static_cast<int>(std::clamp(guess, float(low), float(high)));
      const float product = d * float(q[i]);
      fits = bits(WITH_BASE ? product + base : product) == bits(v[i]);
    }
    if (fits) {
      scale = tried;
      return true;
    }
  }
  return false;
}

inline void put_half(uint8_t* at, c10::Half value) { std::memcpy(at, &value.x, 2); }

// Q4_1: m is the block's least value (its q is 0), 15 d its span.
inline bool q4_1_block(const float* v, uint8_t* group, int64_t column) {
  const auto [low, high] = std::minmax_element(v, v + GROUP);
  const c10::Half m(*low);
  if (bits(static_cast<float>(m)) != bits(*low)) return false;
  c10::Half d;
  int q[GROUP];
  if (!fit_block<true>(v, (*high - *low) / 15.0f, *low, 0, 15, d, q)) return false;
  put_half(group + 2 * column, d);
  put_half(group + 32 + 2 * column, m);
  for (int j = 0; j < GROUP / 2; ++j)
    group[64 + 16 * j + column] = static_cast<uint8_t>(q[2 * j] | (q[2 * j + 1] << 4));
  return true;
}

// Q8_0: 127 d is the block's largest magnitude; the values are d * q, with no base.
inline bool q8_0_block(const float* v, uint8_t* group, int64_t column) {
  float largest = 0.0f;
  for (int i = 0; i < GROUP; ++i) largest = std::max(largest, std::fabs(v[i]));
  c10::Half d;
  int q[GROUP];
  if (!fit_block<false>(v, largest / 127.0f, 0.0f, -128, 127, d, q)) return false;
  put_half(group + 2 * column, d);
  for (int k = 0; k < GROUP; ++k) group[32 + 16 * k + column] = static_cast<uint8_t>(int8_t(q[k]));
  return true;
}

// The packed copy ([N / 16][K / 32][group bytes] uint8), or an empty tensor where a block does
// not rebuild. bits: 4 (Q4_1) or 8 (Q8_0).
at::Tensor search(const at::Tensor& weight, int64_t bits_per_value) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat, "weight must be 2-D float32");
  TORCH_CHECK(bits_per_value == 4 || bits_per_value == 8, "bits must be 4 (Q4_1) or 8 (Q8_0)");
  const int64_t n = weight.size(0), k = weight.size(1);
  if (n % COLUMNS || k % GROUP || n == 0) return at::empty({0}, weight.options().dtype(at::kByte));
  const int64_t bytes = bits_per_value == 4 ? Q4_1::BYTES : Q8_0::BYTES, groups = k / GROUP;
  auto packed = at::zeros({n / COLUMNS, groups, bytes}, weight.options().dtype(at::kByte));
  const auto w = weight.contiguous();
  const float* values = w.data_ptr<float>();
  uint8_t* out = packed.data_ptr<uint8_t>();
  std::atomic<bool> all_fit{true};
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end && all_fit.load(std::memory_order_relaxed); ++row) {
      for (int64_t g = 0; g < groups; ++g) {
        const float* v = values + row * k + g * GROUP;
        uint8_t* group = out + ((row / COLUMNS) * groups + g) * bytes;
        const bool fits = bits_per_value == 4 ? q4_1_block(v, group, row % COLUMNS)
                                              : q8_0_block(v, group, row % COLUMNS);
        if (!fits) {
          all_fit.store(false, std::memory_order_relaxed);
          break;
        }
      }
    }
  });
  return all_fit.load() ? packed : at::empty({0}, weight.options().dtype(at::kByte));
}

}  // namespace quantized
