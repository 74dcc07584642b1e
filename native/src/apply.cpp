#include "apply.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "errors.h"
#include "thread_pool.h"

namespace constraints {
namespace {

template <class T>
T neg_inf();
template <>
float neg_inf<float>() { return -std::numeric_limits<float>::infinity(); }
template <>
double neg_inf<double>() { return -std::numeric_limits<double>::infinity(); }

// 16-bit floats are handled as raw bits; only -inf is ever written.
struct Half { uint16_t bits; };
struct BHalf { uint16_t bits; };
template <>
Half neg_inf<Half>() { return Half{0xFC00}; }
template <>
BHalf neg_inf<BHalf>() { return BHalf{0xFF80}; }

template <class T>
void apply_row(T* row, const Word* mask, int64_t width) {
  const T ninf = neg_inf<T>();
  const int64_t full_words = width / 32;
  int64_t allowed = 0;
  for (int64_t w = 0; w < (width + 31) / 32; ++w) allowed += __builtin_popcount(mask[w]);

  if (allowed * 32 < width) {
    // Sparse: keep the few allowed logits, fill the row, put them back.
    thread_local std::vector<std::pair<int64_t, T>> kept;
    kept.clear();
    for (int64_t w = 0; w < (width + 31) / 32; ++w) {
      Word bits = mask[w];
      while (bits) {
        int64_t j = w * 32 + __builtin_ctz(bits);
        bits &= bits - 1;
        if (j < width) kept.emplace_back(j, row[j]);
      }
    }
    std::fill(row, row + width, ninf);
    for (const auto& [j, v] : kept) row[j] = v;
    return;
  }
  for (int64_t w = 0; w < full_words; ++w) {
    Word bits = mask[w];
    T* p = row + w * 32;
    if (bits == 0xFFFFFFFFu) continue;
    if (bits == 0) {
      std::fill(p, p + 32, ninf);
      continue;
    }
    for (int j = 0; j < 32; ++j)
      if (!((bits >> j) & 1u)) p[j] = ninf;
  }
  for (int64_t j = full_words * 32; j < width; ++j)
    if (!get_bit(mask, static_cast<int32_t>(j))) row[j] = ninf;
}

template <class T>
void apply_typed(const LogitsView& logits, const BitmaskView& mask, const int64_t* rows, int64_t n_rows) {
  const int64_t width = std::min(logits.cols, mask.words * 32);
  T* base = static_cast<T*>(logits.data);
  ThreadPool::global().parallel_for(static_cast<size_t>(n_rows), 1, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) {
      int64_t r = rows ? rows[i] : static_cast<int64_t>(i);
      apply_row(base + r * logits.row_stride, mask.data + r * mask.row_stride, width);
    }
  });
}

}  // namespace

void apply_bitmask(const LogitsView& logits, const BitmaskView& mask, const int64_t* rows, int64_t n_rows) {
  for (int64_t i = 0; i < n_rows; ++i) {
    int64_t r = rows ? rows[i] : i;
    if (r < 0 || r >= logits.rows || r >= mask.rows)
      throw ConstraintError("row " + std::to_string(r) + " is outside the logits or the bitmask");
  }
  switch (logits.dtype) {
    case DType::kFloat32: apply_typed<float>(logits, mask, rows, n_rows); break;
    case DType::kFloat64: apply_typed<double>(logits, mask, rows, n_rows); break;
    case DType::kFloat16: apply_typed<Half>(logits, mask, rows, n_rows); break;
    case DType::kBFloat16: apply_typed<BHalf>(logits, mask, rows, n_rows); break;
  }
}

}  // namespace constraints
