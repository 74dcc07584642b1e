// Regular expressions compiled to a DFA over UTF-8 bytes.
//
// The dialect is Python's re.fullmatch(pattern, text, re.ASCII) for the subset listed in
// docs/constraints.md. Character sets are kept as code point ranges and only turned into UTF-8
// byte sequences when the NFA is built, so the DFA works on the bytes tokens actually spell,
// including tokens that end in the middle of a multi-byte character.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace constraints {

struct ByteDfa {
  static constexpr int32_t kDead = -1;
  int32_t initial = kDead;           // kDead when the language is empty
  std::vector<int32_t> next;         // next[state * 256 + byte]; kDead if no way to accept
  std::vector<uint8_t> accepting;    // per state
  int32_t states() const { return static_cast<int32_t>(accepting.size()); }
  int32_t step(int32_t state, uint8_t byte) const { return next[static_cast<size_t>(state) * 256 + byte]; }
};

struct RegexLimits {
  int max_repeat = 1000;
  size_t max_nfa_states = 250000;
  size_t max_dfa_states = 10000;
};

// Throws ConstraintError with a message that points at the problem.
ByteDfa compile_regex(const std::string& pattern, const RegexLimits& limits = {});

// Only parses: reports syntax errors and unsupported features without building anything.
void check_regex(const std::string& pattern, const RegexLimits& limits = {});

}  // namespace constraints
