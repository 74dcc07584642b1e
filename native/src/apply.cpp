#include "apply.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "errors.h"
#include "thread_pool.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace constraints {
namespace {

// Logits are only ever written with -inf, so every dtype is handled as raw bits of its width.
template <class Bits>
struct Lanes {
  // For each byte of mask bits, 8 lanes of all-ones (allowed) or zero (disallowed): a mixed
  // byte is applied with a branch-free blend the compiler vectorizes.
  Bits lut[256][8];
  Lanes() {
    for (int b = 0; b < 256; ++b)
      for (int k = 0; k < 8; ++k) lut[b][k] = ((b >> k) & 1) ? static_cast<Bits>(~Bits(0)) : Bits(0);
  }
};

// Fills p[0, n) with v. Long runs use non-temporal stores: the row is not read, so streaming
// it out skips the read-for-ownership a normal store pays, halving the memory traffic.
template <class Bits>
void fill_run(Bits* p, int64_t n, Bits v) {
#if defined(__SSE2__)
  if (n * static_cast<int64_t>(sizeof(Bits)) >= 4096) {
    while ((reinterpret_cast<uintptr_t>(p) & 15) != 0 && n > 0) {
      *p++ = v;
      --n;
    }
    Bits lane[16 / sizeof(Bits)];
    std::fill(lane, lane + 16 / sizeof(Bits), v);
    const __m128i vec = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lane));
    const int64_t per = 16 / static_cast<int64_t>(sizeof(Bits));
    int64_t chunks = n / per;
    __m128i* out = reinterpret_cast<__m128i*>(p);
    for (int64_t i = 0; i < chunks; ++i) _mm_stream_si128(out + i, vec);
    _mm_sfence();
    p += chunks * per;
    n -= chunks * per;
  }
#endif
  std::fill(p, p + n, v);
}

template <class Bits>
void apply_row(Bits* __restrict row, const Word* __restrict mask, int64_t width, Bits ninf) {
  static const Lanes<Bits> lanes;
  const int64_t words = (width + 31) / 32;
  int64_t allowed = 0;
  for (int64_t w = 0; w < words && allowed * 32 < width; ++w) allowed += __builtin_popcount(mask[w]);

  if (allowed * 32 < width) {
    // Sparse: keep the few allowed logits, fill the row, put them back.
    thread_local std::vector<std::pair<int64_t, Bits>> kept;
    kept.clear();
    for (int64_t w = 0; w < words; ++w) {
      Word bits = mask[w];
      while (bits) {
        int64_t j = w * 32 + __builtin_ctz(bits);
        bits &= bits - 1;
        if (j < width) kept.emplace_back(j, row[j]);
      }
    }
    fill_run(row, width, ninf);
    for (const auto& [j, v] : kept) row[j] = v;
    return;
  }
  const int64_t full_words = width / 32;
  for (int64_t w = 0; w < full_words; ++w) {
    const Word bits = mask[w];
    Bits* __restrict p = row + w * 32;
    if (bits == ~Word(0)) continue;
    if (bits == 0) {
      std::fill(p, p + 32, ninf);
      continue;
    }
    for (int byte = 0; byte < 4; ++byte) {
      const unsigned b = (bits >> (byte * 8)) & 0xFFu;
      if (b == 0xFFu) continue;
      const Bits* __restrict keep = lanes.lut[b];
      Bits* __restrict q = p + byte * 8;
      for (int k = 0; k < 8; ++k) q[k] = static_cast<Bits>((q[k] & keep[k]) | (ninf & ~keep[k]));
    }
  }
  for (int64_t j = full_words * 32; j < width; ++j)
    if (!get_bit(mask, static_cast<int32_t>(j))) row[j] = ninf;
}

template <class Bits>
void apply_typed(const LogitsView& logits, const BitmaskView& mask, const int64_t* rows, int64_t n_rows, Bits ninf) {
  const int64_t width = std::min(logits.cols, mask.words * 32);
  Bits* base = static_cast<Bits*>(logits.data);
  ThreadPool::global().parallel_for(static_cast<size_t>(n_rows), 1, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) {
      int64_t r = rows ? rows[i] : static_cast<int64_t>(i);
      apply_row(base + r * logits.row_stride, mask.data + r * mask.row_stride, width, ninf);
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
    // -inf in IEEE binary32, binary64, binary16 and bfloat16.
    case DType::kFloat32: apply_typed<uint32_t>(logits, mask, rows, n_rows, 0xFF800000u); break;
    case DType::kFloat64: apply_typed<uint64_t>(logits, mask, rows, n_rows, 0xFFF0000000000000ull); break;
    case DType::kFloat16: apply_typed<uint16_t>(logits, mask, rows, n_rows, uint16_t{0xFC00}); break;
    case DType::kBFloat16: apply_typed<uint16_t>(logits, mask, rows, n_rows, uint16_t{0xFF80}); break;
  }
}

}  // namespace constraints
