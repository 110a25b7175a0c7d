// What the module exports: defined in few_row_linear.cpp and the headers it includes, bound to
// Python in bindings.cpp. Two translation units so that ninja compiles them at once: the
// kernels' code generation beside pybind11's headers, which alone took 10 s of a one-file
// build's 25 s on a 2-core EPYC (2026-12-07).
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>

at::Tensor pack(const at::Tensor& weight);
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed);
int64_t rows_per_pass();
std::tuple<int64_t, int64_t, int64_t> group_bytes();

namespace exact {
at::Tensor attention(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                     const at::Tensor& table, const at::Tensor& query_row,
                     const at::Tensor& query_len, const at::Tensor& prefix_len,
                     const at::Tensor& path);
at::Tensor store_and_attend(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                            const at::Tensor& write_slots, const at::Tensor& k_pool,
                            const at::Tensor& v_pool, const at::Tensor& table,
                            const at::Tensor& query_row, const at::Tensor& query_len,
                            const at::Tensor& prefix_len, const at::Tensor& path);
}  // namespace exact

namespace quantized {
at::Tensor search(const at::Tensor& weight, int64_t bits_per_value);
}  // namespace quantized

namespace row_ops {
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
}  // namespace row_ops

namespace round_ops {
at::Tensor argmax_rows(const at::Tensor& logits);
void compact_rows(const std::vector<at::Tensor>& pools, const at::Tensor& src,
                  const at::Tensor& dst);
std::tuple<at::Tensor, at::Tensor> softmax_topk(const at::Tensor& logits, int64_t k);
}  // namespace round_ops
