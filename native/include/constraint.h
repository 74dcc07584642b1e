// Compiled constraints and per-request state.
//
// A Constraint is immutable once compiled and shared by every request that uses it; all a
// request owns is a RequestState of a few integers per part, so admitting a request is an
// allocation, not a compile. Masks of automaton states are computed once, cached inside the
// constraint, and written into a bitmask row with one copy.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "regex.h"
#include "vocab.h"

namespace constraints {

// The state of one part. Choice: the run [a, b) of sorted strings sharing the output as a
// prefix, which is c bytes long. Regex: the DFA state in a. Max tokens: the count in a.
struct PartState {
  int32_t a = 0, b = 0, c = 0;
};

struct RequestState {
  std::vector<PartState> parts;
  bool dead = false;
};

// The mask of one automaton state: the allowed non-EOS tokens (dense row or sorted ID list,
// whichever is smaller) plus whether EOS is allowed; for choice also each allowed token's
// next state, so advancing by a token is a binary search instead of a byte walk.
struct StateMask {
  std::vector<Word> dense;
  std::vector<int32_t> sparse;
  std::vector<int32_t> next_tokens;
  std::vector<PartState> next_states;
  bool accepting = false;
  int64_t allowed = 0;  // non-EOS tokens allowed

  void write(const Vocab& vocab, Word* row) const;
  size_t bytes() const;
};

class Part {
 public:
  explicit Part(std::shared_ptr<const Vocab> vocab) : vocab_(std::move(vocab)) {}
  virtual ~Part() = default;
  virtual PartState initial() const = 0;
  // Feeds one token (already checked to be a valid ID). Returns false if the part rejects it.
  virtual bool advance(PartState& s, int32_t token) const = 0;
  virtual bool accepting(const PartState& s) const = 0;
  // Writes the part's mask into `row` and returns whether it allows anything.
  virtual bool write(const PartState& s, Word* row, StateMask& scratch) const = 0;
  virtual std::string kind() const = 0;
  virtual size_t memory_bytes() const { return 0; }
  const Vocab& vocab() const { return *vocab_; }

 protected:
  std::shared_ptr<const Vocab> vocab_;
};

// Masks of automaton states computed on first use. Entries are never evicted, so pointers to
// them stay valid; past the byte budget new masks are computed but not kept.
class MaskCache {
 public:
  explicit MaskCache(size_t budget_bytes) : budget_(budget_bytes) {}
  const StateMask* find(uint64_t key) const;
  const StateMask* insert(uint64_t key, std::unique_ptr<StateMask> mask);  // null if over budget
  size_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  size_t size() const;

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<uint64_t, std::unique_ptr<StateMask>> map_;
  std::atomic<size_t> bytes_{0};
  size_t budget_;
};

class Constraint {
 public:
  Constraint(std::shared_ptr<const Vocab> vocab, std::vector<std::shared_ptr<const Part>> parts)
      : vocab_(std::move(vocab)), parts_(std::move(parts)) {}

  RequestState initial() const;
  void advance(RequestState& st, int32_t token) const;
  bool accepting(const RequestState& st) const;
  // Writes the request's mask row. A dead request, or one whose mask would allow nothing,
  // gets the EOS-only row (every token if there is no EOS) and false is returned.
  bool fill(const RequestState& st, Word* row, std::vector<Word>& tmp, StateMask& scratch) const;

  const Vocab& vocab() const { return *vocab_; }
  const std::vector<std::shared_ptr<const Part>>& parts() const { return parts_; }

 private:
  std::shared_ptr<const Vocab> vocab_;
  std::vector<std::shared_ptr<const Part>> parts_;
};

constexpr size_t kDefaultCacheBudget = size_t(512) << 20;

std::shared_ptr<const Part> make_choice(std::shared_ptr<const Vocab> vocab, std::vector<std::string> strings,
                                        size_t cache_budget = kDefaultCacheBudget);
std::shared_ptr<const Part> make_regex(std::shared_ptr<const Vocab> vocab, const std::string& pattern,
                                       size_t cache_budget = kDefaultCacheBudget);
std::shared_ptr<const Part> make_token_set(std::shared_ptr<const Vocab> vocab, const std::vector<int32_t>& ids,
                                           bool banned);
std::shared_ptr<const Part> make_max_tokens(std::shared_ptr<const Vocab> vocab, int32_t limit);

}  // namespace constraints
