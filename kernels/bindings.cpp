// The module's Python face (pybind11, with torch's Tensor casters: half the compile time of
// torch/extension.h); the functions are in few_row_linear.cpp and its headers (exports.h).
#include <torch/csrc/utils/pybind.h>

#include "exports.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("pack", &pack, "weight [N, K] -> [N / 16, K, 16], in its own dtype (fp32 or bf16)");
  module.def("pack_quantized", &quantized::search,
             "fp32 weight [N, K], bits 4 or 8 -> its Q4_1 or Q8_0 copy, or an empty tensor");
  module.def("group_bytes", &group_bytes,
             "(k per quantized group, bytes of a Q4_1 group of 16 columns, of a Q8_0 one)");
  module.def("linear", &linear, "x [rows <= 16, K] @ weight.T from the packed weight");
  module.def("rows_per_pass", &rows_per_pass,
             "rows of x one pass over a chunk of weights takes (16 AVX-512, 6 AVX2)");
  module.def("attention", &exact::attention, "paged attention, fp32 (kernels/paged_reference.py)");
  module.def("store_and_attend", &exact::store_and_attend,
             "this step's K/V into their slots, then attention (fp32)");
  module.def("rms_norm", &row_ops::rms_norm, "x [..., D] fp32 normalised, times weight [D]");
  module.def("rotary", &row_ops::rotary, "x [T, H, D] fp32 rotated by cos, sin [T, 1, D]");
  module.def("argmax_rows", &round_ops::argmax_rows, "logits [R, V] fp32 -> first max ids [R]");
  module.def("compact_rows", &round_ops::compact_rows,
             "row src[i] of every pool to row dst[i], all read before any is written");
  module.def("softmax_topk", &round_ops::softmax_topk,
             "logits [R, V] fp32, k -> softmax's k largest (probs [R, k], ids [R, k])");
}
