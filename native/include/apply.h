// Applying a packed bitmask to CPU logits in place: disallowed entries become -inf.
//
// The work is bandwidth-bound, so each row is written once and never read where it can be
// avoided: rows that allow few tokens save those logits, fill the whole row with -inf and
// write them back; other rows skip all-allowed words and fill all-disallowed ones.
#pragma once

#include <cstdint>

#include "vocab.h"

namespace constraints {

enum class DType { kFloat32, kFloat64, kFloat16, kBFloat16 };

struct LogitsView {
  void* data;
  DType dtype;
  int64_t rows;
  int64_t cols;
  int64_t row_stride;  // in elements
};

struct BitmaskView {
  const Word* data;
  int64_t rows;
  int64_t words;
  int64_t row_stride;  // in words
};

// Applies bitmask row r to logits row r for each r in `rows` (all rows when rows is null).
// Columns past the bitmask's width are left untouched.
void apply_bitmask(const LogitsView& logits, const BitmaskView& mask, const int64_t* rows, int64_t n_rows);

}  // namespace constraints
