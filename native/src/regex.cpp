// Regex -> AST over code point sets -> Thompson NFA over UTF-8 bytes -> DFA (subset
// construction) with every state that cannot reach acceptance removed.
#include "regex.h"

#include <algorithm>
#include <map>
#include <utility>

#include "errors.h"

namespace constraints {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // sorted, disjoint, inclusive

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.emplace_back(lo, hi);
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

Ranges digit() { return {{'0', '9'}}; }
Ranges word() { return normalized({{'0', '9'}, {'A', 'Z'}, {'a', 'z'}, {'_', '_'}}); }
Ranges space() { return {{9, 13}, {32, 32}}; }

struct Node {
  enum Kind { kSet, kConcat, kAlt, kRepeat } kind;
  Ranges set;
  std::vector<int> kids;
  int min = 0, max = 0;  // kRepeat; max < 0 means unbounded
};

std::vector<uint32_t> decode_utf8(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<uint8_t>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + static_cast<size_t>(len) > s.size()) throw ConstraintError("regex is not valid UTF-8");
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(len);
  }
  return out;
}

class Parser {
 public:
  Parser(const std::string& pattern, const RegexLimits& limits) : p_(decode_utf8(pattern)), limits_(limits) {}

  int parse() {
    bool caret = !p_.empty() && p_[0] == '^';
    if (caret) pos_ = 1;
    int root = parse_alt(0);
    if (pos_ < p_.size()) fail(p_[pos_] == ')' ? "unbalanced parenthesis" : "unexpected character");
    // In Python an anchor next to a top-level | belongs to one alternative only.
    if ((caret || dollar_) && nodes[static_cast<size_t>(root)].kind == Node::kAlt)
      fail("'^' and '$' are only supported around the whole pattern; group alternatives as ^(a|b)$");
    return root;
  }
  std::vector<Node> nodes;

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw ConstraintError("invalid regex: " + what + " at position " + std::to_string(pos_));
  }
  bool at_end() const { return pos_ >= p_.size(); }
  uint32_t peek() const { return p_[pos_]; }
  int add(Node n) {
    nodes.push_back(std::move(n));
    return static_cast<int>(nodes.size()) - 1;
  }
  int set_node(Ranges r) { return add(Node{Node::kSet, normalized(std::move(r)), {}, 0, 0}); }

  int parse_alt(int depth) {
    std::vector<int> branches{parse_concat(depth)};
    while (!at_end() && peek() == '|') {
      ++pos_;
      branches.push_back(parse_concat(depth));
    }
    if (branches.size() == 1) return branches[0];
    return add(Node{Node::kAlt, {}, std::move(branches), 0, 0});
  }

  int parse_concat(int depth) {
    std::vector<int> items;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$') {
        if (depth != 0 || pos_ + 1 != p_.size()) fail("'$' is only supported at the end of the pattern");
        ++pos_;
        dollar_ = true;
        if (!at_end()) fail("nothing to repeat");
        break;
      }
      if (peek() == '^') fail("'^' is only supported at the start of the pattern");
      int atom = parse_atom(depth);
      items.push_back(parse_quantifier(atom));
    }
    return add(Node{Node::kConcat, {}, std::move(items), 0, 0});
  }

  // Reads {m}, {m,}, {,n}, {m,n} at pos_ (which is at '{'). Returns false, with pos_
  // unchanged, when the braces do not form a repeat (Python then reads '{' literally).
  bool read_braces(int& min, int& max) {
    size_t here = pos_;
    ++pos_;
    std::string lo, hi;
    while (!at_end() && peek() >= '0' && peek() <= '9') lo += static_cast<char>(p_[pos_++]);
    bool comma = !at_end() && peek() == ',';
    if (comma) {
      ++pos_;
      while (!at_end() && peek() >= '0' && peek() <= '9') hi += static_cast<char>(p_[pos_++]);
    } else {
      hi = lo;
    }
    if (at_end() || peek() != '}' || (lo.empty() && !comma)) {
      pos_ = here;
      return false;
    }
    ++pos_;
    auto number = [&](const std::string& s) {
      if (s.size() > 9 || std::stol(s) > limits_.max_repeat)
        fail("counted repeats above " + std::to_string(limits_.max_repeat) + " are not supported");
      return static_cast<int>(std::stol(s));
    };
    min = lo.empty() ? 0 : number(lo);
    max = hi.empty() ? -1 : number(hi);
    if (max >= 0 && max < min) fail("min repeat greater than max repeat");
    return true;
  }

  bool quantifier_here(int& min, int& max) {
    if (at_end()) return false;
    switch (peek()) {
      case '*': ++pos_; min = 0; max = -1; return true;
      case '+': ++pos_; min = 1; max = -1; return true;
      case '?': ++pos_; min = 0; max = 1; return true;
      case '{': return read_braces(min, max);
      default: return false;
    }
  }

  int parse_quantifier(int atom) {
    int min = 0, max = 0;
    if (!quantifier_here(min, max)) return atom;
    if (!at_end() && peek() == '?') ++pos_;  // lazy: the same language under a full match
    else if (!at_end() && peek() == '+') fail("possessive quantifiers are not supported");
    int min2, max2;
    size_t here = pos_;
    if (quantifier_here(min2, max2)) {
      pos_ = here;
      fail("multiple repeat");
    }
    return add(Node{Node::kRepeat, {}, {atom}, min, max});
  }

  int parse_atom(int depth) {
    uint32_t c = p_[pos_];
    size_t here = pos_;
    int min, max;
    switch (c) {
      case '*': case '+': case '?': fail("nothing to repeat");
      case '{':
        if (read_braces(min, max)) {
          pos_ = here;
          fail("nothing to repeat");
        }
        ++pos_;
        return set_node({{c, c}});
      case '(': return parse_group(depth);
      case '[': return parse_class();
      case '.': ++pos_; return set_node(complement({{'\n', '\n'}}));
      case '\\': {
        ++pos_;
        Ranges r;
        escape(false, r);
        return set_node(r);
      }
      default: ++pos_; return set_node({{c, c}});
    }
  }

  int parse_group(int depth) {
    ++pos_;
    if (!at_end() && peek() == '?') {
      ++pos_;
      if (!at_end() && peek() == ':') {
        ++pos_;
      } else if (pos_ + 1 < p_.size() && peek() == 'P' && p_[pos_ + 1] == '<') {
        pos_ += 2;
        size_t start = pos_;
        while (!at_end() && peek() != '>') {
          uint32_t ch = peek();
          bool ok = ch == '_' || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch >= 0x80 ||
                    (pos_ > start && ch >= '0' && ch <= '9');
          if (!ok) fail("bad character in group name");
          ++pos_;
        }
        if (at_end()) fail("missing >, unterminated name");
        if (pos_ == start) fail("missing group name");
        ++pos_;
      } else {
        fail("only (...), (?:...) and (?P<name>...) groups are supported");
      }
    }
    int inner = parse_alt(depth + 1);
    if (at_end() || peek() != ')') fail("missing ), unterminated subpattern");
    ++pos_;
    return inner;
  }

  // An escape after the backslash at pos_. Sets `r` to its code points; returns false for a
  // class escape (\d, \w, ...), which cannot be a range endpoint.
  bool escape(bool in_class, Ranges& r) {
    if (at_end()) fail("bad escape (end of pattern)");
    uint32_t c = p_[pos_++];
    auto hex = [&](int digits) {
      uint32_t v = 0;
      for (int k = 0; k < digits; ++k) {
        if (at_end()) fail("incomplete escape");
        uint32_t h = peek();
        int d = h >= '0' && h <= '9' ? int(h - '0') : h >= 'a' && h <= 'f' ? int(h - 'a' + 10)
              : h >= 'A' && h <= 'F' ? int(h - 'A' + 10) : -1;
        if (d < 0) fail("incomplete escape");
        v = v * 16 + static_cast<uint32_t>(d);
        ++pos_;
      }
      if (v > kMaxCodePoint) fail("bad escape");
      return v;
    };
    uint32_t literal;
    switch (c) {
      case 'd': r = digit(); return false;
      case 'D': r = complement(digit()); return false;
      case 'w': r = word(); return false;
      case 'W': r = complement(word()); return false;
      case 's': r = space(); return false;
      case 'S': r = complement(space()); return false;
      case 't': literal = 9; break;
      case 'n': literal = 10; break;
      case 'r': literal = 13; break;
      case 'f': literal = 12; break;
      case 'v': literal = 11; break;
      case 'a': literal = 7; break;
      case 'x': literal = hex(2); break;
      case 'u': literal = hex(4); break;
      case 'U': literal = hex(8); break;
      case 'b':
        if (!in_class) fail("\\b (word boundary) is not supported");
        literal = 8;
        break;
      default:
        if (c >= '0' && c <= '9') fail("backreferences and octal escapes are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
          fail(std::string("bad escape \\") + static_cast<char>(c));
        literal = c;
    }
    r = {{literal, literal}};
    return true;
  }

  int parse_class() {
    size_t start = pos_++;
    bool negate = !at_end() && peek() == '^';
    if (negate) ++pos_;
    Ranges set;
    bool first = true;
    for (;;) {
      if (at_end()) {
        pos_ = start;
        fail("unterminated character set");
      }
      uint32_t c = p_[pos_++];
      if (c == ']' && !first) break;
      first = false;
      Ranges lo_set;
      bool lo_single = true;
      if (c == '\\') lo_single = escape(true, lo_set);
      else lo_set = {{c, c}};
      if (!at_end() && peek() == '-') {
        ++pos_;
        if (at_end()) {
          pos_ = start;
          fail("unterminated character set");
        }
        uint32_t d = p_[pos_++];
        if (d == ']') {
          set.insert(set.end(), lo_set.begin(), lo_set.end());
          set.emplace_back('-', '-');
          break;
        }
        Ranges hi_set;
        bool hi_single = true;
        if (d == '\\') hi_single = escape(true, hi_set);
        else hi_set = {{d, d}};
        if (!lo_single || !hi_single || hi_set[0].first < lo_set[0].first) fail("bad character range");
        set.emplace_back(lo_set[0].first, hi_set[0].first);
      } else {
        set.insert(set.end(), lo_set.begin(), lo_set.end());
      }
    }
    set = normalized(set);
    return set_node(negate ? complement(set) : set);
  }

  std::vector<uint32_t> p_;
  size_t pos_ = 0;
  bool dollar_ = false;
  RegexLimits limits_;
};

// ---- NFA over bytes ----

struct Nfa {
  struct Edge {
    uint8_t lo, hi;
    int to;
  };
  std::vector<std::vector<int>> eps;
  std::vector<std::vector<Edge>> edges;
  size_t max_states;

  int state() {
    if (eps.size() >= max_states) throw ConstraintError("regex is too large (its automaton exceeds the state limit)");
    eps.emplace_back();
    edges.emplace_back();
    return static_cast<int>(eps.size()) - 1;
  }
};

int utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void utf8_encode(uint32_t cp, uint8_t* out) {
  switch (utf8_len(cp)) {
    case 1: out[0] = static_cast<uint8_t>(cp); break;
    case 2:
      out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    case 3:
      out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    default:
      out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  }
}

using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;

// Splits [lo, hi] into ranges whose UTF-8 encodings are a fixed sequence of byte ranges: first
// at the encoding-length boundaries, then wherever a continuation byte does not cover its
// full 0x80..0xBF span.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRanges>& out) {
  for (uint32_t bound : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= bound && hi > bound) {
      utf8_sequences(lo, bound, out);
      utf8_sequences(bound + 1, hi, out);
      return;
    }
  }
  int n = utf8_len(lo);
  for (int i = 1; i < n; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  utf8_encode(lo, a);
  utf8_encode(hi, b);
  ByteRanges seq;
  for (int k = 0; k < n; ++k) seq.emplace_back(a[k], b[k]);
  out.push_back(seq);
}

struct Fragment {
  int start, end;
};

class NfaBuilder {
 public:
  NfaBuilder(const std::vector<Node>& nodes, Nfa& nfa) : nodes_(nodes), nfa_(nfa) {}

  Fragment build(int id) {
    const Node& n = nodes_[static_cast<size_t>(id)];
    switch (n.kind) {
      case Node::kSet: return build_set(n.set);
      case Node::kConcat: {
        int start = nfa_.state();
        int end = start;
        for (int kid : n.kids) {
          Fragment f = build(kid);
          nfa_.eps[static_cast<size_t>(end)].push_back(f.start);
          end = f.end;
        }
        return {start, end};
      }
      case Node::kAlt: {
        int start = nfa_.state(), end = nfa_.state();
        for (int kid : n.kids) {
          Fragment f = build(kid);
          nfa_.eps[static_cast<size_t>(start)].push_back(f.start);
          nfa_.eps[static_cast<size_t>(f.end)].push_back(end);
        }
        return {start, end};
      }
      case Node::kRepeat: {
        int start = nfa_.state();
        int end = start;
        for (int k = 0; k < n.min; ++k) {
          Fragment f = build(n.kids[0]);
          nfa_.eps[static_cast<size_t>(end)].push_back(f.start);
          end = f.end;
        }
        if (n.max < 0) {
          Fragment f = build(n.kids[0]);
          int loop = nfa_.state();
          nfa_.eps[static_cast<size_t>(end)].push_back(loop);
          nfa_.eps[static_cast<size_t>(loop)].push_back(f.start);
          nfa_.eps[static_cast<size_t>(f.end)].push_back(loop);
          return {start, loop};
        }
        int out = nfa_.state();
        for (int k = n.min; k < n.max; ++k) {
          nfa_.eps[static_cast<size_t>(end)].push_back(out);
          Fragment f = build(n.kids[0]);
          nfa_.eps[static_cast<size_t>(end)].push_back(f.start);
          end = f.end;
        }
        nfa_.eps[static_cast<size_t>(end)].push_back(out);
        return {start, out};
      }
    }
    return {0, 0};
  }

 private:
  Fragment build_set(const Ranges& set) {
    int start = nfa_.state(), end = nfa_.state();
    std::vector<ByteRanges> seqs;
    for (auto [lo, hi] : set) {
      // Surrogates have no UTF-8 encoding, so they can never be matched.
      if (lo < 0xD800) utf8_sequences(lo, std::min(hi, 0xD7FFu), seqs);
      if (hi > 0xDFFF) utf8_sequences(std::max(lo, 0xE000u), hi, seqs);
    }
    for (const auto& seq : seqs) {
      int from = start;
      for (size_t k = 0; k < seq.size(); ++k) {
        int to = k + 1 == seq.size() ? end : nfa_.state();
        nfa_.edges[static_cast<size_t>(from)].push_back({seq[k].first, seq[k].second, to});
        from = to;
      }
    }
    return {start, end};
  }

  const std::vector<Node>& nodes_;
  Nfa& nfa_;
};

void closure(const Nfa& nfa, std::vector<int>& set, std::vector<uint8_t>& seen) {
  std::vector<int> stack(set.begin(), set.end());
  for (int s : set) seen[static_cast<size_t>(s)] = 1;
  while (!stack.empty()) {
    int s = stack.back();
    stack.pop_back();
    for (int t : nfa.eps[static_cast<size_t>(s)]) {
      if (!seen[static_cast<size_t>(t)]) {
        seen[static_cast<size_t>(t)] = 1;
        set.push_back(t);
        stack.push_back(t);
      }
    }
  }
  for (int s : set) seen[static_cast<size_t>(s)] = 0;
  std::sort(set.begin(), set.end());
}

ByteDfa determinize(const Nfa& nfa, int start, int accept, size_t max_states) {
  // Bytes that no NFA edge tells apart behave the same; one representative per class.
  std::vector<uint8_t> boundary(257, 0);
  boundary[0] = 1;
  for (const auto& out : nfa.edges)
    for (const auto& e : out) boundary[e.lo] = boundary[static_cast<size_t>(e.hi) + 1] = 1;
  std::vector<std::pair<int, int>> classes;  // [first, last] byte of each class
  for (int b = 0; b < 256;) {
    int e = b + 1;
    while (e < 256 && !boundary[static_cast<size_t>(e)]) ++e;
    classes.emplace_back(b, e - 1);
    b = e;
  }

  std::map<std::vector<int>, int> ids;
  std::vector<std::vector<int>> sets;
  std::vector<uint8_t> seen(nfa.eps.size(), 0);
  std::vector<int32_t> next;
  auto intern = [&](std::vector<int> set) {
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    if (sets.size() >= max_states)
      throw ConstraintError("regex is too complex: its DFA exceeds " + std::to_string(max_states) + " states");
    int id = static_cast<int>(sets.size());
    ids.emplace(set, id);
    sets.push_back(std::move(set));
    return id;
  };
  std::vector<int> init{start};
  closure(nfa, init, seen);
  intern(init);
  for (size_t d = 0; d < sets.size(); ++d) {
    next.resize((d + 1) * 256, ByteDfa::kDead);
    for (auto [first, last] : classes) {
      std::vector<int> moved;
      for (int s : sets[d])
        for (const auto& e : nfa.edges[static_cast<size_t>(s)])
          if (e.lo <= first && first <= e.hi) moved.push_back(e.to);
      if (moved.empty()) continue;
      std::sort(moved.begin(), moved.end());
      moved.erase(std::unique(moved.begin(), moved.end()), moved.end());
      closure(nfa, moved, seen);
      int target = intern(std::move(moved));
      for (int b = first; b <= last; ++b) next[d * 256 + static_cast<size_t>(b)] = target;
    }
  }
  size_t n = sets.size();
  std::vector<uint8_t> accepting(n, 0);
  for (size_t d = 0; d < n; ++d) accepting[d] = std::binary_search(sets[d].begin(), sets[d].end(), accept);

  // Keep only states from which an accepting state can be reached.
  std::vector<std::vector<int>> reverse(n);
  for (size_t d = 0; d < n; ++d)
    for (int b = 0; b < 256; ++b) {
      int32_t t = next[d * 256 + static_cast<size_t>(b)];
      if (t != ByteDfa::kDead && (reverse[static_cast<size_t>(t)].empty() || reverse[static_cast<size_t>(t)].back() != int(d)))
        reverse[static_cast<size_t>(t)].push_back(static_cast<int>(d));
    }
  std::vector<uint8_t> live(n, 0);
  std::vector<int> stack;
  for (size_t d = 0; d < n; ++d)
    if (accepting[d]) {
      live[d] = 1;
      stack.push_back(static_cast<int>(d));
    }
  while (!stack.empty()) {
    int t = stack.back();
    stack.pop_back();
    for (int s : reverse[static_cast<size_t>(t)])
      if (!live[static_cast<size_t>(s)]) {
        live[static_cast<size_t>(s)] = 1;
        stack.push_back(s);
      }
  }
  std::vector<int32_t> remap(n, ByteDfa::kDead);
  ByteDfa dfa;
  for (size_t d = 0; d < n; ++d)
    if (live[d]) {
      remap[d] = dfa.states();
      dfa.accepting.push_back(accepting[d]);
    }
  dfa.next.assign(dfa.accepting.size() * 256, ByteDfa::kDead);
  for (size_t d = 0; d < n; ++d) {
    if (!live[d]) continue;
    for (size_t b = 0; b < 256; ++b) {
      int32_t t = next[d * 256 + b];
      dfa.next[static_cast<size_t>(remap[d]) * 256 + b] = t == ByteDfa::kDead ? ByteDfa::kDead : remap[static_cast<size_t>(t)];
    }
  }
  dfa.initial = remap[0];
  return dfa;
}

}  // namespace

void check_regex(const std::string& pattern, const RegexLimits& limits) {
  Parser parser(pattern, limits);
  parser.parse();
}

ByteDfa compile_regex(const std::string& pattern, const RegexLimits& limits) {
  Parser parser(pattern, limits);
  int root = parser.parse();
  Nfa nfa;
  nfa.max_states = limits.max_nfa_states;
  NfaBuilder builder(parser.nodes, nfa);
  Fragment f = builder.build(root);
  return determinize(nfa, f.start, f.end, limits.max_dfa_states);
}

}  // namespace constraints
