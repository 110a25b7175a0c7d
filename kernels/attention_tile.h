// One tile of the CPU paged attention (exact_attention.h): up to TILE consecutive tokens of one
// request and one head. The keys every token of the tile sees are read once for the tile; a
// key's score is a 16-lane dot product whose 16 lanes are summed with 15 other keys' by
// vmath::sum16's fixed tree; each token's exponentials are summed lane-wise block by block and
// its values weighted key by key in order. So a token's arithmetic is the same whatever tile it
// is in, or alone.
#pragma once
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "simd16.h"
#include "vector_math.h"

namespace exact {

using vmath::LANES;
using vmath::lanes_below;
constexpr int64_t TILE = 8;  // tokens whose shared keys are read once

struct Keys {
  const int64_t* table_row;
  const int64_t* path;
  int64_t prefix;
  int64_t slot(int64_t j) const { return j < prefix ? table_row[j] : path[j - prefix]; }
};

struct Head {
  const float* k_pool;
  const float* v_pool;
  int64_t offset;  // of this head's KV head within a slot
  int64_t slot_stride;
  int64_t dim;
};

// One key's 16-lane dot product with a query held in registers (C chunks of 16).
template <int C>
inline simd::vec lane_dots(const simd::vec* qv, const float* k) {
  simd::vec acc = simd::zero();
  for (int c = 0; c < C; ++c) acc = simd::fmadd(qv[c], simd::loadu(k + c * LANES), acc);
  return acc;
}

// A whole block of 16 keys: constant indices (the fold), so the 16 sums stay in registers.
template <int C, typename SlotOf, size_t... R>
inline simd::vec block_dots(const simd::vec* qv, const Head& head, SlotOf slot_of,
                            int64_t first, std::index_sequence<R...>) {
  const simd::vec dots[] = {
      lane_dots<C>(qv, head.k_pool + slot_of(first + R) * head.slot_stride + head.offset)...};
  return vmath::sum16(dots);
}

// Any block (count <= 16 keys, any head dim): masked loads, the same sums for each key.
template <typename SlotOf>
simd::vec partial_block_dots(const float* q, const Head& head, SlotOf slot_of, int64_t first,
                             int64_t count) {
  simd::vec dots[LANES];
  for (int64_t r = 0; r < LANES; ++r) {
    dots[r] = simd::zero();
    if (r >= count) continue;
    const float* k = head.k_pool + slot_of(first + r) * head.slot_stride + head.offset;
    for (int64_t i = 0; i < head.dim; i += LANES) {
      const simd::mask m = lanes_below(i, head.dim);
      dots[r] = simd::fmadd(simd::maskz_loadu(m, q + i), simd::maskz_loadu(m, k + i), dots[r]);
    }
  }
  return vmath::sum16(dots);
}

// Scores of keys first..first+count-1 (count <= 16) for one query, into scores[first..]. C: the
// head dim in 16-lane chunks (0: any dim), so the usual dims keep q in registers.
template <int C, typename SlotOf>
void score_block(const float* q, const Head& head, SlotOf slot_of, int64_t first, int64_t count,
                 float scale, float* scores) {
  simd::vec sums;
  if constexpr (C > 0) {
    simd::vec qv[C];
    for (int c = 0; c < C; ++c) qv[c] = simd::loadu(q + c * LANES);
    sums = count == LANES ? block_dots<C>(qv, head, slot_of, first, std::make_index_sequence<16>())
                          : partial_block_dots(q, head, slot_of, first, count);
  } else {
    sums = partial_block_dots(q, head, slot_of, first, count);
  }
  simd::mask_storeu(scores + first, lanes_below(0, count), simd::mul(sums, simd::set1(scale)));
}

// exp(score - max) in place for a token's num_keys scores; returns their sum, added lane-wise
// block by block (a fixed order for a given num_keys), then reduced by the fixed tree.
float softmax_numerators(float* scores, int64_t num_keys) {
  simd::vec top = simd::set1(-INFINITY);
  for (int64_t j = 0; j < num_keys; j += LANES)
    top = simd::max(top, simd::mask_loadu(top, lanes_below(j, num_keys), scores + j));
  const simd::vec shift = simd::set1(simd::reduce_max(top));
  simd::vec total = simd::zero();
  for (int64_t j = 0; j < num_keys; j += LANES) {
    const simd::mask m = lanes_below(j, num_keys);
    const simd::vec e = vmath::exp(simd::sub(simd::maskz_loadu(m, scores + j), shift));
    simd::mask_storeu(scores + j, m, e);
    total = simd::add(total, simd::maskz_mov(m, e));
  }
  return vmath::sum_lanes(total);
}

// Weighted values of CC (1 or 2) dim chunks from lane i, keys first..last-1 in order, for the
// tokens T at once: each value row is read once for all of them, and each token's sums take
// their keys in order. The accumulators are indexed by constants only (the fold expressions),
// so that they stay in registers: indexed by loop counters, GCC kept a copy of them in memory
// and stored every one at each key.
template <int CC, typename SlotOf, size_t... T>
void weigh_values(const float* const* weights, const Head& head, SlotOf slot_of, int64_t first,
                  int64_t last, int64_t i, simd::vec (*acc)[CC], std::index_sequence<T...>) {
  const simd::mask m0 = lanes_below(i, head.dim), m1 = lanes_below(i + LANES, head.dim);
  simd::vec low[] = {acc[T][0]...};
  simd::vec high[] = {acc[T][CC - 1]...};
  for (int64_t j = first; j < last; ++j) {
    const float* row = head.v_pool + slot_of(j) * head.slot_stride + head.offset + i;
    const simd::vec v0 = simd::maskz_loadu(m0, row);
    ((low[T] = simd::fmadd(simd::set1(weights[T][j]), v0, low[T])), ...);
    if constexpr (CC == 2) {
      const simd::vec v1 = simd::maskz_loadu(m1, row + LANES);
      ((high[T] = simd::fmadd(simd::set1(weights[T][j]), v1, high[T])), ...);
    }
  }
  ((acc[T][0] = low[T]), ...);
  if constexpr (CC == 2) ((acc[T][1] = high[T]), ...);
}

struct Tile {
  const float* q[TILE];  // each token's query for this head
  float* out[TILE];
  Keys keys[TILE];
  int64_t num_keys[TILE];
  int64_t size;
  int64_t shared;  // keys every token of the tile sees, all from the table row
};

// Scores for the tile: shared keys block by block across tokens, then each token's own tail.
template <int C>
void tile_scores(const Tile& tile, const Head& head, float scale, std::vector<float>& scores,
                 int64_t stride) {
  const int64_t shared_blocks = tile.shared / LANES;
  const int64_t* row = tile.keys[0].table_row;
  auto from_row = [row](int64_t j) { return row[j]; };
  for (int64_t b = 0; b < shared_blocks; ++b)
    for (int64_t t = 0; t < tile.size; ++t)
      score_block<C>(tile.q[t], head, from_row, b * LANES, LANES, scale,
                     scores.data() + t * stride);
  for (int64_t t = 0; t < tile.size; ++t) {
    const Keys& keys = tile.keys[t];
    auto from_keys = [&keys](int64_t j) { return keys.slot(j); };
    for (int64_t j = shared_blocks * LANES; j < tile.num_keys[t]; j += LANES)
      score_block<C>(tile.q[t], head, from_keys, j, std::min(LANES, tile.num_keys[t] - j), scale,
                     scores.data() + t * stride);
  }
}

// CC dim chunks of the outputs: the shared keys for all tokens at once, then each one's tail.
template <int N, int CC>
void tile_chunks(const Tile& tile, const Head& head, const float* const* weights,
                 const float* totals, int64_t i) {
  simd::vec acc[N][CC];
  for (int t = 0; t < N; ++t)
    for (int c = 0; c < CC; ++c) acc[t][c] = simd::zero();
  const int64_t* row = tile.keys[0].table_row;
  weigh_values<CC>(weights, head, [row](int64_t j) { return row[j]; }, 0, tile.shared, i, acc,
                   std::make_index_sequence<N>());
  for (int t = 0; t < N; ++t) {
    const Keys& keys = tile.keys[t];
    const float* own[1] = {weights[t]};
    weigh_values<CC>(own, head, [&keys](int64_t j) { return keys.slot(j); }, tile.shared,
                     tile.num_keys[t], i, &acc[t], std::make_index_sequence<1>());
    if (tile.num_keys[t] == 0) continue;  // its output stays zero
    const simd::vec total = simd::set1(totals[t]);
    for (int c = 0; c < CC; ++c)
      simd::mask_storeu(tile.out[t] + i + c * LANES, lanes_below(i + c * LANES, head.dim),
                        simd::div(acc[t][c], total));
  }
}

template <int N>
void tile_outputs(const Tile& tile, const Head& head, const float* const* weights,
                  const float* totals) {
  if (head.dim % (2 * LANES) == 0) {
    for (int64_t i = 0; i < head.dim; i += 2 * LANES)
      tile_chunks<N, 2>(tile, head, weights, totals, i);
  } else {
    for (int64_t i = 0; i < head.dim; i += LANES) tile_chunks<N, 1>(tile, head, weights, totals, i);
  }
}

void one_tile(const Tile& tile, const Head& head, float scale, std::vector<float>& scores) {
  int64_t longest = 0;
  for (int64_t t = 0; t < tile.size; ++t) longest = std::max(longest, tile.num_keys[t]);
  const int64_t stride = (longest + LANES - 1) / LANES * LANES;
  scores.resize(tile.size * stride);
  if (head.dim == 64) tile_scores<4>(tile, head, scale, scores, stride);
  else if (head.dim == 128) tile_scores<8>(tile, head, scale, scores, stride);
  else tile_scores<0>(tile, head, scale, scores, stride);
  const float* weights[TILE];
  float totals[TILE];
  for (int64_t t = 0; t < tile.size; ++t) {
    weights[t] = scores.data() + t * stride;
    totals[t] = softmax_numerators(scores.data() + t * stride, tile.num_keys[t]);
  }
  switch (tile.size) {
    case 1: return tile_outputs<1>(tile, head, weights, totals);
    case 2: return tile_outputs<2>(tile, head, weights, totals);
    case 3: return tile_outputs<3>(tile, head, weights, totals);
    case 4: return tile_outputs<4>(tile, head, weights, totals);
    case 5: return tile_outputs<5>(tile, head, weights, totals);
    case 6: return tile_outputs<6>(tile, head, weights, totals);
    case 7: return tile_outputs<7>(tile, head, weights, totals);
    default: return tile_outputs<TILE>(tile, head, weights, totals);
  }
}

}  // namespace exact
