#include "constraint.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string_view>

#include "errors.h"
#include "thread_pool.h"

namespace constraints {
namespace {

constexpr int32_t kMaxChoiceBytes = 8191;
constexpr int32_t kEagerRegexStates = 4096;

// Walks the token trie below `node` together with an automaton at state `s`. `step(s, byte,
// out)` returns false where the automaton rejects the byte, which cuts off every token below.
// `visit(token, state)` is called for each token the automaton accepts, with its end state.
template <class S, class Step, class Visit>
void walk_trie(const Vocab::Trie& t, uint32_t node, const S& s, const Step& step, const Visit& visit) {
  for (uint32_t e = t.child_begin[node]; e < t.child_begin[node + 1]; ++e) {
    S next;
    if (!step(s, t.edge_byte[e], next)) continue;
    uint32_t child = t.edge_target[e];
    for (uint32_t k = t.tok_begin[child]; k < t.tok_begin[child + 1]; ++k) visit(t.token_ids[k], next);
    walk_trie(t, child, next, step, visit);
  }
}

// Builds a mask from the allowed non-EOS tokens, sorted by ID.
void finish_mask(const Vocab& vocab, std::vector<int32_t> tokens, bool accepting, StateMask& m) {
  m.accepting = accepting;
  m.allowed = static_cast<int64_t>(tokens.size());
  m.dense.clear();
  m.sparse.clear();
  if (m.allowed < vocab.words()) {
    m.sparse = std::move(tokens);
  } else {
    m.dense.assign(static_cast<size_t>(vocab.words()), 0);
    for (int32_t id : tokens) set_bit(m.dense.data(), id);
    if (accepting)
      for (int32_t id : vocab.eos_ids()) set_bit(m.dense.data(), id);
  }
}

bool allows_anything(const Vocab& vocab, const StateMask& m) {
  return m.allowed > 0 || (m.accepting && !vocab.eos_ids().empty());
}

class RegexPart final : public Part {
 public:
  RegexPart(std::shared_ptr<const Vocab> vocab, ByteDfa dfa, size_t budget)
      : Part(std::move(vocab)), dfa_(std::move(dfa)), cache_(budget) {
    if (dfa_.states() <= kEagerRegexStates) {
      eager_.resize(static_cast<size_t>(dfa_.states()));
      ThreadPool::global().parallel_for(eager_.size(), 1, [&](size_t lo, size_t hi) {
        for (size_t s = lo; s < hi; ++s) {
          eager_[s] = std::make_unique<StateMask>();
          compute(static_cast<int32_t>(s), *eager_[s]);
        }
      });
    }
  }

  PartState initial() const override { return {dfa_.initial, 0, 0}; }

  bool advance(PartState& s, int32_t token) const override {
    uint32_t len = vocab_->token_len(token);
    if (s.a < 0 || len == 0) return false;
    const uint8_t* p = vocab_->token_bytes(token);
    int32_t state = s.a;
    for (uint32_t i = 0; i < len && state >= 0; ++i) state = dfa_.step(state, p[i]);
    if (state < 0) return false;
    s.a = state;
    return true;
  }

  bool accepting(const PartState& s) const override { return s.a >= 0 && dfa_.accepting[static_cast<size_t>(s.a)]; }

  bool write(const PartState& s, Word* row, StateMask& scratch) const override {
    if (s.a < 0) {
      std::memset(row, 0, sizeof(Word) * static_cast<size_t>(vocab_->words()));
      return false;
    }
    const StateMask* m = lookup(s.a, scratch);
    m->write(*vocab_, row);
    return allows_anything(*vocab_, *m);
  }

  std::string kind() const override { return "regex"; }
  size_t memory_bytes() const override {
    size_t total = dfa_.next.size() * sizeof(int32_t) + cache_.bytes();
    for (const auto& m : eager_) total += m->bytes();
    return total;
  }
  int32_t states() const { return dfa_.states(); }

 private:
  void compute(int32_t state, StateMask& m) const {
    std::vector<int32_t> tokens;
    auto step = [this](const int32_t& from, uint8_t byte, int32_t& to) {
      to = dfa_.step(from, byte);
      return to >= 0;
    };
    walk_trie(vocab_->trie(), 0, state, step, [&](int32_t token, int32_t) { tokens.push_back(token); });
    std::sort(tokens.begin(), tokens.end());
    finish_mask(*vocab_, std::move(tokens), dfa_.accepting[static_cast<size_t>(state)] != 0, m);
  }

  const StateMask* lookup(int32_t state, StateMask& scratch) const {
    if (!eager_.empty()) return eager_[static_cast<size_t>(state)].get();
    if (const StateMask* m = cache_.find(static_cast<uint64_t>(state))) return m;
    auto fresh = std::make_unique<StateMask>();
    compute(state, *fresh);
    if (const StateMask* kept = cache_.insert(static_cast<uint64_t>(state), std::move(fresh))) return kept;
    compute(state, scratch);
    return &scratch;
  }

  ByteDfa dfa_;
  std::vector<std::unique_ptr<StateMask>> eager_;
  mutable MaskCache cache_;
};

class ChoicePart final : public Part {
 public:
  ChoicePart(std::shared_ptr<const Vocab> vocab, std::vector<std::string> strings, size_t budget)
      : Part(std::move(vocab)), cache_(budget) {
    if (strings.empty()) throw ConstraintError("choice must list at least one string");
    std::vector<std::string_view> views(strings.begin(), strings.end());
    std::sort(views.begin(), views.end());
    views.erase(std::unique(views.begin(), views.end()), views.end());
    size_t total = 0;
    for (auto v : views) {
      if (v.size() > static_cast<size_t>(kMaxChoiceBytes))
        throw ConstraintError("a choice is longer than " + std::to_string(kMaxChoiceBytes) + " bytes");
      total += v.size();
    }
    data_.reserve(total);
    off_.reserve(views.size() + 1);
    off_.push_back(0);
    for (auto v : views) {
      data_.insert(data_.end(), v.begin(), v.end());
      off_.push_back(data_.size());
    }
    n_ = static_cast<int32_t>(views.size());
    StateMask scratch;
    lookup(initial(), scratch);  // the root mask is needed by every request: compute it now
  }

  PartState initial() const override { return {0, n_, 0}; }

  bool advance(PartState& s, int32_t token) const override {
    uint32_t len = vocab_->token_len(token);
    if (s.a >= s.b || len == 0) return false;
    if (const StateMask* m = cache_.find(key(s))) {
      auto it = std::lower_bound(m->next_tokens.begin(), m->next_tokens.end(), token);
      if (it == m->next_tokens.end() || *it != token) return false;
      s = m->next_states[static_cast<size_t>(it - m->next_tokens.begin())];
      return true;
    }
    const uint8_t* p = vocab_->token_bytes(token);
    PartState cur = s;
    for (uint32_t i = 0; i < len; ++i)
      if (!narrow(cur, p[i], cur)) return false;
    s = cur;
    return true;
  }

  bool accepting(const PartState& s) const override { return s.a < s.b && length(s.a) == static_cast<size_t>(s.c); }

  bool write(const PartState& s, Word* row, StateMask& scratch) const override {
    if (s.a >= s.b) {
      std::memset(row, 0, sizeof(Word) * static_cast<size_t>(vocab_->words()));
      return false;
    }
    const StateMask* m = lookup(s, scratch);
    m->write(*vocab_, row);
    return allows_anything(*vocab_, *m);
  }

  std::string kind() const override { return "choice"; }
  size_t memory_bytes() const override { return data_.size() + off_.size() * sizeof(uint64_t) + cache_.bytes(); }

 private:
  static uint64_t key(const PartState& s) { return (static_cast<uint64_t>(s.a) << 13) | static_cast<uint64_t>(s.c); }
  size_t length(int32_t i) const { return off_[static_cast<size_t>(i) + 1] - off_[static_cast<size_t>(i)]; }
  // The byte at `depth` of string i, or -1 past its end (so shorter strings sort first).
  int byte_at(int32_t i, int32_t depth) const {
    return length(i) > static_cast<size_t>(depth) ? data_[off_[static_cast<size_t>(i)] + static_cast<size_t>(depth)] : -1;
  }

  // The strings in [s.a, s.b) share s.c bytes; keep those whose next byte is `b`.
  bool narrow(const PartState& s, uint8_t b, PartState& out) const {
    auto first_at_least = [&](int target) {
      int32_t lo = s.a, hi = s.b;
      while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (byte_at(mid, s.c) < target) lo = mid + 1;
        else hi = mid;
      }
      return lo;
    };
    int32_t lo = first_at_least(b);
    if (lo >= s.b || byte_at(lo, s.c) != b) return false;
    int32_t hi = b == 255 ? s.b : first_at_least(b + 1);
    out = {lo, hi, s.c + 1};
    return true;
  }

  void compute(const PartState& s, StateMask& m) const {
    std::vector<std::pair<int32_t, PartState>> found;
    auto step = [this](const PartState& from, uint8_t byte, PartState& to) { return narrow(from, byte, to); };
    walk_trie(vocab_->trie(), 0, s, step, [&](int32_t token, const PartState& to) { found.emplace_back(token, to); });
    std::sort(found.begin(), found.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<int32_t> tokens;
    tokens.reserve(found.size());
    m.next_states.clear();
    m.next_states.reserve(found.size());
    for (const auto& [token, to] : found) {
      tokens.push_back(token);
      m.next_states.push_back(to);
    }
    m.next_tokens = tokens;
    finish_mask(*vocab_, std::move(tokens), accepting(s), m);
  }

  const StateMask* lookup(const PartState& s, StateMask& scratch) const {
    if (const StateMask* m = cache_.find(key(s))) return m;
    auto fresh = std::make_unique<StateMask>();
    compute(s, *fresh);
    if (const StateMask* kept = cache_.insert(key(s), std::move(fresh))) return kept;
    compute(s, scratch);
    return &scratch;
  }

  std::vector<uint8_t> data_;
  std::vector<uint64_t> off_;
  int32_t n_ = 0;
  mutable MaskCache cache_;
};

class TokenSetPart final : public Part {
 public:
  TokenSetPart(std::shared_ptr<const Vocab> vocab, const std::vector<int32_t>& ids, bool banned)
      : Part(std::move(vocab)), banned_(banned) {
    std::vector<uint8_t> listed(static_cast<size_t>(vocab_->n_tokens()), 0);
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_->n_tokens())
        throw ConstraintError("token ID " + std::to_string(id) + " is outside the vocabulary (" +
                              std::to_string(vocab_->n_tokens()) + " tokens)");
      if (vocab_->is_eos(id))
        throw ConstraintError("token ID " + std::to_string(id) +
                              " is an EOS token; EOS is allowed exactly when the constraint accepts");
      listed[static_cast<size_t>(id)] = 1;
    }
    std::vector<int32_t> tokens;
    for (int32_t id = 0; id < vocab_->n_tokens(); ++id)
      if (!vocab_->is_eos(id) && listed[static_cast<size_t>(id)] != banned) tokens.push_back(id);
    finish_mask(*vocab_, std::move(tokens), true, mask_);
  }

  PartState initial() const override { return {}; }
  bool advance(PartState&, int32_t token) const override {
    if (!mask_.dense.empty()) return get_bit(mask_.dense.data(), token);
    return std::binary_search(mask_.sparse.begin(), mask_.sparse.end(), token);
  }
  bool accepting(const PartState&) const override { return true; }
  bool write(const PartState&, Word* row, StateMask&) const override {
    mask_.write(*vocab_, row);
    return allows_anything(*vocab_, mask_);
  }
  std::string kind() const override { return banned_ ? "banned_tokens" : "allowed_tokens"; }
  size_t memory_bytes() const override { return mask_.bytes(); }

 private:
  bool banned_;
  StateMask mask_;
};

class MaxTokensPart final : public Part {
 public:
  MaxTokensPart(std::shared_ptr<const Vocab> vocab, int32_t limit) : Part(std::move(vocab)), limit_(limit) {
    if (limit < 0) throw ConstraintError("max_tokens must not be negative");
  }
  PartState initial() const override { return {}; }
  bool advance(PartState& s, int32_t) const override {
    if (s.a >= limit_) return false;
    ++s.a;
    return true;
  }
  void count_eos(PartState& s) const { ++s.a; }
  bool accepting(const PartState&) const override { return true; }
  bool write(const PartState& s, Word* row, StateMask&) const override {
    const auto& src = s.a < limit_ ? vocab_->all_tokens_row() : vocab_->eos_row();
    std::memcpy(row, src.data(), sizeof(Word) * src.size());
    return s.a < limit_ || !vocab_->eos_ids().empty();
  }
  std::string kind() const override { return "max_tokens"; }

 private:
  int32_t limit_;
};

}  // namespace

void StateMask::write(const Vocab& vocab, Word* row) const {
  size_t words = static_cast<size_t>(vocab.words());
  if (!dense.empty()) {
    std::memcpy(row, dense.data(), words * sizeof(Word));
    return;
  }
  std::memset(row, 0, words * sizeof(Word));
  for (int32_t id : sparse) set_bit(row, id);
  if (accepting)
    for (int32_t id : vocab.eos_ids()) set_bit(row, id);
}

size_t StateMask::bytes() const {
  return sizeof(StateMask) + dense.size() * sizeof(Word) + sparse.size() * sizeof(int32_t) +
         next_tokens.size() * sizeof(int32_t) + next_states.size() * sizeof(PartState);
}

const StateMask* MaskCache::find(uint64_t key) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : it->second.get();
}

const StateMask* MaskCache::insert(uint64_t key, std::unique_ptr<StateMask> mask) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  auto it = map_.find(key);
  if (it != map_.end()) return it->second.get();  // another thread got there first
  size_t cost = mask->bytes() + 64;
  if (bytes_.load(std::memory_order_relaxed) + cost > budget_) return nullptr;
  bytes_.fetch_add(cost, std::memory_order_relaxed);
  return map_.emplace(key, std::move(mask)).first->second.get();
}

size_t MaskCache::size() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return map_.size();
}

RequestState Constraint::initial() const {
  RequestState st;
  st.parts.reserve(parts_.size());
  for (const auto& p : parts_) st.parts.push_back(p->initial());
  return st;
}

bool Constraint::accepting(const RequestState& st) const {
  if (st.dead) return false;
  for (size_t k = 0; k < parts_.size(); ++k)
    if (!parts_[k]->accepting(st.parts[k])) return false;
  return true;
}

void Constraint::advance(RequestState& st, int32_t token) const {
  if (st.dead) return;
  if (token < 0 || token >= vocab_->n_tokens()) {
    st.dead = true;
    return;
  }
  if (vocab_->is_eos(token)) {
    if (!accepting(st)) {
      st.dead = true;
      return;
    }
    for (size_t k = 0; k < parts_.size(); ++k)
      if (auto* counter = dynamic_cast<const MaxTokensPart*>(parts_[k].get())) counter->count_eos(st.parts[k]);
    return;
  }
  for (size_t k = 0; k < parts_.size(); ++k) {
    if (!parts_[k]->advance(st.parts[k], token)) {
      st.dead = true;
      return;
    }
  }
}

bool Constraint::fill(const RequestState& st, Word* row, std::vector<Word>& tmp, StateMask& scratch) const {
  size_t words = static_cast<size_t>(vocab_->words());
  bool any = false;
  if (!st.dead) {
    any = parts_[0]->write(st.parts[0], row, scratch);
    if (parts_.size() > 1) {
      tmp.resize(words);
      for (size_t k = 1; k < parts_.size(); ++k) {
        parts_[k]->write(st.parts[k], tmp.data(), scratch);
        Word acc = 0;
        for (size_t w = 0; w < words; ++w) acc |= (row[w] &= tmp[w]);
        any = acc != 0;
      }
    }
  }
  if (any) return true;
  const auto& fallback = vocab_->eos_ids().empty() ? vocab_->all_tokens_row() : vocab_->eos_row();
  std::memcpy(row, fallback.data(), words * sizeof(Word));
  return false;
}

std::shared_ptr<const Part> make_choice(std::shared_ptr<const Vocab> vocab, std::vector<std::string> strings,
                                        size_t cache_budget) {
  return std::make_shared<ChoicePart>(std::move(vocab), std::move(strings), cache_budget);
}

std::shared_ptr<const Part> make_regex(std::shared_ptr<const Vocab> vocab, const std::string& pattern,
                                       size_t cache_budget) {
  return std::make_shared<RegexPart>(std::move(vocab), compile_regex(pattern), cache_budget);
}

std::shared_ptr<const Part> make_token_set(std::shared_ptr<const Vocab> vocab, const std::vector<int32_t>& ids,
                                           bool banned) {
  return std::make_shared<TokenSetPart>(std::move(vocab), ids, banned);
}

std::shared_ptr<const Part> make_max_tokens(std::shared_ptr<const Vocab> vocab, int32_t limit) {
  return std::make_shared<MaxTokensPart>(std::move(vocab), limit);
}

}  // namespace constraints
