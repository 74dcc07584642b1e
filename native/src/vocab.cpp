#include "vocab.h"

#include <algorithm>
#include <numeric>

#include "errors.h"

namespace constraints {

Vocab::Vocab(const std::vector<std::string>& tokens, const std::vector<int32_t>& eos_ids, int32_t size)
    : n_tokens_(static_cast<int32_t>(tokens.size())), size_(size) {
  if (size_ < n_tokens_) throw ConstraintError("vocabulary size is smaller than the number of tokens");
  if (n_tokens_ == 0) throw ConstraintError("the vocabulary is empty");
  words_ = (size_ + 31) / 32;
  offsets_.reserve(tokens.size() + 1);
  offsets_.push_back(0);
  for (const auto& t : tokens) {
    bytes_.insert(bytes_.end(), t.begin(), t.end());
    offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
  }
  is_eos_.assign(tokens.size(), 0);
  eos_row_.assign(static_cast<size_t>(words_), 0);
  for (int32_t id : eos_ids) {
    if (id < 0 || id >= n_tokens_) throw ConstraintError("EOS token ID " + std::to_string(id) + " is outside the vocabulary");
    if (!is_eos_[static_cast<size_t>(id)]) eos_ids_.push_back(id);
    is_eos_[static_cast<size_t>(id)] = 1;
    set_bit(eos_row_.data(), id);
  }
  all_tokens_row_.assign(static_cast<size_t>(words_), 0);
  for (int32_t id = 0; id < n_tokens_; ++id) set_bit(all_tokens_row_.data(), id);
  build_trie();
}

// Builds the trie breadth-first from the tokens sorted by bytes: the tokens below any node
// form one contiguous run of the sorted list, so each node is a (run, depth) pair and its
// children are the sub-runs sharing the next byte. Nodes are numbered in the order they are
// created, so every node's child edges are contiguous.
void Vocab::build_trie() {
  std::vector<int32_t> order;
  for (int32_t id = 0; id < n_tokens_; ++id)
    if (!is_eos(id) && token_len(id) > 0) order.push_back(id);
  auto less = [&](int32_t a, int32_t b) {
    const uint8_t* pa = token_bytes(a);
    const uint8_t* pb = token_bytes(b);
    return std::lexicographical_compare(pa, pa + token_len(a), pb, pb + token_len(b));
  };
  std::stable_sort(order.begin(), order.end(), less);

  struct Pending {
    size_t lo, hi;
    uint32_t depth;
  };
  std::vector<Pending> nodes{{0, order.size(), 0}};
  for (size_t n = 0; n < nodes.size(); ++n) {
    auto [lo, hi, depth] = nodes[n];
    trie_.child_begin.push_back(static_cast<uint32_t>(trie_.edge_byte.size()));
    trie_.tok_begin.push_back(static_cast<uint32_t>(trie_.token_ids.size()));
    while (lo < hi && token_len(order[lo]) == depth) trie_.token_ids.push_back(order[lo++]);
    while (lo < hi) {
      uint8_t b = token_bytes(order[lo])[depth];
      size_t end = lo;
      while (end < hi && token_bytes(order[end])[depth] == b) ++end;
      trie_.edge_byte.push_back(b);
      trie_.edge_target.push_back(static_cast<uint32_t>(nodes.size()));
      nodes.push_back({lo, end, depth + 1});
      lo = end;
    }
  }
  trie_.child_begin.push_back(static_cast<uint32_t>(trie_.edge_byte.size()));
  trie_.tok_begin.push_back(static_cast<uint32_t>(trie_.token_ids.size()));
}

}  // namespace constraints
