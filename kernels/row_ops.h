// RMSNorm and rotary embedding of a CPU step's rows (fp32), each one call where torch's
// reference (kernels/fused_reference.py) is five to seven small ops: on the default model a
// 2-core decode step spent about 2 of its 17 ms dispatching those ops (2026-12-06).
//
// Each row's result depends on that row alone (no sum across rows, a fixed order within one),
// so a token gets the same bits in a decode, a prefill chunk or a verify. Rotary gives the
// reference's bits: x * cos and rotate_half(x) * sin rounded apart, then added (no fused
// multiply-add, hence this file's fp-contract setting). RMSNorm's sum of squares is a fixed
// 16-lane tree rather than torch's, so its results may differ from the reference's in the
// last bit.
#pragma once
#include "tensor_api.h"
#include <cmath>

#include "simd16.h"

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

namespace row_ops {

using simd::LANES;
constexpr int64_t GRAIN_ROWS = 32;  // rows a thread takes at least: a decode step stays inline

inline void rms_norm_row(const float* x, const float* w, float* out, int64_t d, float eps) {
  simd::vec squares = simd::zero();
  int64_t i = 0;
  for (; i + LANES <= d; i += LANES) {
    const simd::vec v = simd::loadu(x + i);
    squares = simd::add(squares, simd::mul(v, v));
  }
  float sum = simd::reduce_add(squares);
  for (; i < d; ++i) sum += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(sum / static_cast<float>(d) + eps);
  const simd::vec s = simd::set1(scale);
  for (i = 0; i + LANES <= d; i += LANES) {  // (x * scale) * w, two roundings as the reference
    const simd::vec normed = simd::mul(simd::loadu(x + i), s);
    simd::storeu(out + i, simd::mul(normed, simd::loadu(w + i)));
  }
  for (; i < d; ++i) out[i] = (x[i] * scale) * w[i];
}

// x: [..., D] fp32; weight: [D]. Returns x normalised by its root mean square, times weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "rms_norm takes float32 x and weight");
  const int64_t d = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == d, "weight must be [x.size(-1)]");
  const auto xc = x.contiguous();
  const auto wc = weight.contiguous();
  auto out = at::empty_like(xc);
  const float* src = xc.data_ptr<float>();
  const float* w = wc.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, xc.numel() / d, GRAIN_ROWS, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) rms_norm_row(src + r * d, w, dst + r * d, d, e);
  });
  return out;
}

// One head's row: out = x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1).
inline void rotary_row(const float* x, const float* c, const float* s, float* out, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float first = x[i] * c[i];
    const float turned = -x[i + half] * s[i];
    out[i] = first + turned;
    const float second = x[i + half] * c[i + half];
    const float turned_back = x[i] * s[i + half];
    out[i + half] = second + turned_back;
  }
}

// x: [T, H, D] fp32; cos, sin: [T, 1, D] with unit stride along D (views of one table gather).
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 3 && cos.dim() == 3 && sin.dim() == 3, "rotary takes 3-D tensors");
  TORCH_CHECK(x.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat, "rotary takes float32 tensors");
  const int64_t tokens = x.size(0), heads = x.size(1), d = x.size(2);
  TORCH_CHECK(d % 2 == 0 && cos.size(0) == tokens && sin.size(0) == tokens &&
                  cos.size(2) == d && sin.size(2) == d, "cos and sin must be [T, 1, D]");
  TORCH_CHECK(cos.stride(2) == 1 && sin.stride(2) == 1, "cos and sin need unit stride in D");
  const auto xc = x.contiguous();
  auto out = at::empty_like(xc);
  const float* src = xc.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const int64_t cs = cos.stride(0), ss = sin.stride(0);
  at::parallel_for(0, tokens, GRAIN_ROWS, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t at_row = (t * heads + h) * d;
        rotary_row(src + at_row, c + t * cs, s + t * ss, dst + at_row, d / 2);
      }
  });
  return out;
}

}  // namespace row_ops

#pragma GCC pop_options
