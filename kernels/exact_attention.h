// Paged attention on the CPU, fp32 (simd16.h: AVX-512 or AVX2): the same function as
// kernels/paged_reference.py.
// Included by few_row_linear.cpp, so the CPU kernels build as one translation unit (torch's
// headers, most of the build time, are compiled once).
//
// Why: torch's attention gathers a padded [B, K] context per step (a copy of every request's
// keys and values, per layer), and how it blocks its sums depends on the step's shape, so a
// token's output rounds differently in a 1-token decode than in a 16-token verify. Here every
// (token, head) gets the same arithmetic over that token's own logical keys in order
// (attention_tile.h), whatever else shares the step and however the threads split the work: a
// token has the same bits in a decode, a prefill chunk or a tree verify. The target's --exact
// mode needs that; the default CPU path (float32, --attention auto) uses the kernel for its
// speed: on the default model's heads 4-15x torch's for a decode, 1.6-3.9x for a 17-node
// verify (docs/cpu.md).
//
// Work: the step's tokens are cut into tiles, runs of at most TILE consecutive tokens of one
// request (a tree's nodes, a prefill chunk; a decode is a tile of one), and each (tile, head)
// is one task.
#pragma once
#include "tensor_api.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "attention_tile.h"
#include "check.h"

namespace exact {

void check(const at::Tensor& t, int64_t dims, c10::ScalarType type, const char* name) {
  KERNEL_CHECK(t.dim() == dims && t.scalar_type() == type && t.is_contiguous() && !t.is_cuda(),
               "%s: expected a contiguous CPU tensor of %lld dims and type %s", name,
               static_cast<long long>(dims), c10::toString(type));
}

// Each run of consecutive tokens of one request, cut into tiles of at most TILE tokens of
// near-equal sizes (17 tokens: 6, 6, 5), as [first, last) pairs.
std::vector<std::pair<int64_t, int64_t>> tiles_of(const int64_t* rows, int64_t tokens) {
  std::vector<std::pair<int64_t, int64_t>> tiles;
  for (int64_t first = 0; first < tokens;) {
    int64_t last = first + 1;
    while (last < tokens && rows[last] == rows[first]) ++last;
    const int64_t run = last - first, count = (run + TILE - 1) / TILE;
    for (int64_t i = 0; i < count; ++i)
      tiles.emplace_back(first + run * i / count, first + run * (i + 1) / count);
    first = last;
  }
  return tiles;
}

// Where the tile's tokens read and write for head h, and the keys they all see.
struct Step {
  const float* q;
  float* out;
  const int64_t *rows, *lens, *prefixes, *table, *path;
  int64_t heads, table_width, path_width, dim;
};

Tile tile_for(const Step& step, int64_t first, int64_t last, int64_t h) {
  Tile tile{};
  tile.size = last - first;
  tile.shared = INT64_MAX;
  for (int64_t t = first; t < last; ++t) {
    const int64_t n = t - first, offset = (t * step.heads + h) * step.dim;
    tile.q[n] = step.q + offset;
    tile.out[n] = step.out + offset;
    tile.keys[n] = Keys{step.table + step.rows[t] * step.table_width,
                        step.path + t * step.path_width, step.prefixes[t]};
    tile.num_keys[n] = step.lens[t];
    tile.shared = std::min({tile.shared, step.prefixes[t], step.lens[t]});
  }
  return tile;
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                     const at::Tensor& table, const at::Tensor& query_row,
                     const at::Tensor& query_len, const at::Tensor& prefix_len,
                     const at::Tensor& path) {
  check(q, 3, at::kFloat, "q");
  check(k_pool, 3, at::kFloat, "k_pool");
  check(v_pool, 3, at::kFloat, "v_pool");
  check(table, 2, at::kLong, "table");
  check(path, 2, at::kLong, "path");
  for (const auto* t : {&query_row, &query_len, &prefix_len}) check(*t, 1, at::kLong, "rows");
  const int64_t tokens = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_pool.size(1), group = heads / kv_heads;
  TORCH_CHECK(heads % kv_heads == 0, "heads must be a multiple of the KV heads");
  TORCH_CHECK(v_pool.sizes() == k_pool.sizes() && k_pool.size(2) == dim, "pool shapes differ");
  auto out = at::zeros_like(q);
  const Step step{q.data_ptr<float>(), out.data_ptr<float>(), query_row.data_ptr<int64_t>(),
                  query_len.data_ptr<int64_t>(), prefix_len.data_ptr<int64_t>(),
                  table.data_ptr<int64_t>(), path.data_ptr<int64_t>(), heads, table.size(1),
                  path.size(1), dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const auto tiles = tiles_of(step.rows, tokens);
  const int64_t num_tiles = static_cast<int64_t>(tiles.size());
  // Head-major, so that threads given contiguous ranges get equal shares of every tile.
  at::parallel_for(0, heads * num_tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t index = begin; index < end; ++index) {
      const int64_t h = index / num_tiles;
      const Head head{k_pool.data_ptr<float>(), v_pool.data_ptr<float>(), (h / group) * dim,
                      kv_heads * dim, dim};
      const auto [first, last] = tiles[index % num_tiles];
      one_tile(tile_for(step, first, last, h), head, scale, scores);
    }
  });
  return out;
}

// This step's keys and values written to their slots, then attention: one call where
// index_copy_ twice and the attention were three (the two copies ~9 us of a 2-core decode
// step's layer). k_new, v_new: [T, kv_heads, D]; write_slots: [T] int64.
at::Tensor store_and_attend(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new,
                            const at::Tensor& write_slots, const at::Tensor& k_pool,
                            const at::Tensor& v_pool, const at::Tensor& table,
                            const at::Tensor& query_row, const at::Tensor& query_len,
                            const at::Tensor& prefix_len, const at::Tensor& path) {
  check(write_slots, 1, at::kLong, "write_slots");
  const int64_t tokens = write_slots.size(0), slots = k_pool.size(0);
  const int64_t row = k_pool.size(1) * k_pool.size(2);  // floats of one slot
  TORCH_CHECK(k_new.scalar_type() == at::kFloat && v_new.scalar_type() == at::kFloat &&
                  k_new.numel() == tokens * row && v_new.numel() == tokens * row,
              "k_new and v_new must be float32 [T, kv_heads, D], one row per write slot");
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous(), "pools must be contiguous");
  const auto keys = k_new.contiguous(), values = v_new.contiguous();
  const int64_t* slot = write_slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)  // all checked before any is written
    KERNEL_CHECK(slot[t] >= 0 && slot[t] < slots, "write slot %lld outside the pool",
                 static_cast<long long>(slot[t]));
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(k_pool.data_ptr<float>() + slot[t] * row, keys.data_ptr<float>() + t * row,
                row * sizeof(float));
    std::memcpy(v_pool.data_ptr<float>() + slot[t] * row, values.data_ptr<float>() + t * row,
                row * sizeof(float));
  }
  return attention(q, k_pool, v_pool, table, query_row, query_len, prefix_len, path);
}

}  // namespace exact
