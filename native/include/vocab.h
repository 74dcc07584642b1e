// The vocabulary a constraint is compiled against, and a byte trie over its tokens.
//
// Masks for byte-level constraints (choice, regex) are computed by walking the token trie and
// the constraint's automaton together, so tokens sharing a prefix share the work and a branch
// the automaton rejects is cut off once for all the tokens below it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace constraints {

using Word = uint32_t;

class Vocab {
 public:
  Vocab(const std::vector<std::string>& tokens, const std::vector<int32_t>& eos_ids, int32_t size);

  int32_t n_tokens() const { return n_tokens_; }  // IDs that spell something (or are special)
  int32_t size() const { return size_; }          // logits width, >= n_tokens
  int32_t words() const { return words_; }        // int32 words per bitmask row
  bool is_eos(int32_t id) const { return is_eos_[static_cast<size_t>(id)] != 0; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  const uint8_t* token_bytes(int32_t id) const { return bytes_.data() + offsets_[static_cast<size_t>(id)]; }
  uint32_t token_len(int32_t id) const {
    return offsets_[static_cast<size_t>(id) + 1] - offsets_[static_cast<size_t>(id)];
  }
  // Every ID < n_tokens allowed, and only the EOS IDs allowed, as bitmask rows.
  const std::vector<Word>& all_tokens_row() const { return all_tokens_row_; }
  const std::vector<Word>& eos_row() const { return eos_row_; }

  // The token trie, over tokens with non-empty bytes that are not EOS. Node 0 is the root.
  // Children of node n are edges [child_begin[n], child_begin[n+1]), sorted by byte; tokens
  // spelling exactly the path to n are token_ids[tok_begin[n], tok_begin[n+1]).
  struct Trie {
    std::vector<uint32_t> child_begin;
    std::vector<uint8_t> edge_byte;
    std::vector<uint32_t> edge_target;
    std::vector<uint32_t> tok_begin;
    std::vector<int32_t> token_ids;
    size_t nodes() const { return child_begin.size() - 1; }
  };
  const Trie& trie() const { return trie_; }

 private:
  void build_trie();

  int32_t n_tokens_;
  int32_t size_;
  int32_t words_;
  std::vector<uint8_t> bytes_;
  std::vector<uint32_t> offsets_;
  std::vector<uint8_t> is_eos_;
  std::vector<int32_t> eos_ids_;
  std::vector<Word> all_tokens_row_;
  std::vector<Word> eos_row_;
  Trie trie_;
};

inline void set_bit(Word* row, int32_t id) { row[id >> 5] |= Word(1) << (id & 31); }
inline bool get_bit(const Word* row, int32_t id) { return (row[id >> 5] >> (id & 31)) & 1u; }

}  // namespace constraints
