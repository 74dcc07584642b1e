// Direct tests of the batch of rows (native/include/batch.h), without Python: rows following
// their live lists, placeholders, rewritten histories, row moves, the start_fill/fill protocol
// and its waits, and errors. Built and run by tests/constraints/test_native_core.py; exits
// non-zero if any check fails.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "batch.h"
#include "constraint.h"
#include "errors.h"
#include "vocab.h"

using namespace constraints;

namespace {

int failures = 0;

#define CHECK(cond)                                                               \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                                 \
    }                                                                             \
  } while (0)

// Checks that `expr` throws ConstraintError whose message contains `part`.
#define CHECK_THROWS(expr, part)                                                                    \
  do {                                                                                              \
    std::string what_;                                                                              \
    try {                                                                                           \
      expr;                                                                                         \
    } catch (const ConstraintError& e) {                                                            \
      what_ = e.what();                                                                             \
    }                                                                                               \
    if (what_.find(part) == std::string::npos) {                                                    \
      std::fprintf(stderr, "%s:%d: %s: wanted an error with \"%s\", got \"%s\"\n", __FILE__, __LINE__, \
                   #expr, part, what_.c_str());                                                     \
      ++failures;                                                                                   \
    }                                                                                               \
  } while (0)

// Token IDs: a b c r e d re, then EOS (empty).
const std::vector<std::string> kTokens = {"a", "b", "c", "r", "e", "d", "re", ""};
constexpr int32_t kEos = 7;
constexpr int32_t kSize = 40;  // logits width: two words per mask row

std::shared_ptr<const Vocab> make_vocab() { return std::make_shared<Vocab>(kTokens, std::vector<int32_t>{kEos}, kSize); }

// A live list the test edits between calls, the way vLLM edits its lists.
struct Live final : TokenList {
  std::vector<int32_t> ids;
  explicit Live(std::vector<int32_t> v = {}) : ids(std::move(v)) {}
  int64_t size() const override { return static_cast<int64_t>(ids.size()); }
  int32_t at(int64_t i) const override { return ids[static_cast<size_t>(i)]; }
};

struct Mask {
  std::vector<Word> data;
  int64_t rows, words;
  Mask(int64_t rows_, int64_t words_) : data(static_cast<size_t>(rows_ * words_), 0), rows(rows_), words(words_) {}
  MaskRows view() { return {data.data(), rows, words, static_cast<size_t>(words)}; }
  std::vector<int32_t> allowed(int64_t row) const {
    std::vector<int32_t> out;
    for (int32_t id = 0; id < kSize; ++id)
      if (get_bit(data.data() + row * words, id)) out.push_back(id);
    return out;
  }
};

using Ids = std::vector<int32_t>;

// A part that allows token 0 only and lets the test see and hold up its mask writes.
class ProbePart final : public Part {
 public:
  explicit ProbePart(std::shared_ptr<const Vocab> vocab) : Part(std::move(vocab)) {}
  PartState initial() const override { return {}; }
  bool advance(PartState&, int32_t) const override { return true; }
  bool accepting(const PartState&) const override { return true; }
  bool write(const PartState&, Word* row, StateMask&) const override {
    {
      std::unique_lock<std::mutex> lock(mutex);
      open_cv.wait(lock, [&] { return open; });
    }
    writes.fetch_add(1);
    if (throw_once.exchange(false)) throw ConstraintError("probe failed on purpose");
    std::memset(row, 0, static_cast<size_t>(vocab().words()) * sizeof(Word));
    set_bit(row, 0);
    return true;
  }
  std::string kind() const override { return "probe"; }

  void set_open(bool value) const {
    {
      std::lock_guard<std::mutex> lock(mutex);
      open = value;
    }
    open_cv.notify_all();
  }

  mutable std::atomic<int> writes{0};
  mutable std::atomic<bool> throw_once{false};

 private:
  mutable std::mutex mutex;
  mutable std::condition_variable open_cv;
  mutable bool open = true;
};

struct Fixture {
  std::shared_ptr<const Vocab> vocab = make_vocab();
  std::shared_ptr<const Constraint> choice() const {
    return std::make_shared<Constraint>(vocab, std::vector<std::shared_ptr<const Part>>{make_choice(vocab, {"red", "abc"})});
  }
  std::shared_ptr<const Constraint> with(std::shared_ptr<const Part> part) const {
    return std::make_shared<Constraint>(vocab, std::vector<std::shared_ptr<const Part>>{std::move(part)});
  }
};

void rows_follow_their_lists() {
  Fixture f;
  Batch b(f.vocab, 4);
  auto out = std::make_shared<Live>();
  b.add(1, f.choice(), out, nullptr);
  Mask m(4, f.vocab->words());
  CHECK(b.fill(m.view()).empty());
  CHECK(m.allowed(1) == (Ids{0, 3, 6}));  // a, r, re
  out->ids = {3};
  b.fill(m.view());
  CHECK(m.allowed(1) == (Ids{4}));
  out->ids.push_back(4);
  b.fill(m.view());
  CHECK(m.allowed(1) == (Ids{5}));
  CHECK(!b.is_accepting(1));
  out->ids.push_back(5);
  CHECK(b.fill(m.view()).empty());
  CHECK(m.allowed(1) == (Ids{kEos}));
  CHECK(b.is_accepting(1));

  // A row without a list is advanced by the caller.
  b.add(0, f.choice(), nullptr, nullptr);
  b.advance(0, {6});
  b.fill(m.view());
  CHECK(m.allowed(0) == (Ids{5}));
  CHECK(b.occupied_rows() == (Ids{0, 1}));
}

void placeholders_wait_for_their_tokens() {
  Fixture f;
  Batch b(f.vocab, 2);
  auto out = std::make_shared<Live>(Ids{3, -1});
  b.add(0, f.choice(), out, nullptr);
  b.add(1, f.choice(), std::make_shared<Live>(Ids{0}), nullptr);
  Mask m(2, f.vocab->words());
  CHECK(b.start_fill(m.view()) == (Ids{1}));  // row 0's next token is not known yet
  CHECK(b.fill(m.view()).empty());
  CHECK(m.allowed(0) == (Ids{4}));  // the tokens known so far
  CHECK(m.allowed(1) == (Ids{1}));
  out->ids[1] = 4;  // the placeholder filled in
  b.fill(m.view());
  CHECK(m.allowed(0) == (Ids{5}));
}

void rewritten_lists_start_over() {
  Fixture f;
  Batch b(f.vocab, 3);
  auto out = std::make_shared<Live>(Ids{3, 4});
  b.add(0, f.choice(), out, nullptr);
  Mask m(3, f.vocab->words());
  b.fill(m.view());
  CHECK(m.allowed(0) == (Ids{5}));
  out->ids = {3, 0};  // same length, the last token changed: a new history
  b.fill(m.view());
  CHECK(m.allowed(0) == (Ids{kEos}));  // r then a: dead, EOS only
  CHECK(b.is_dead(0));
  out->ids = {0};
  CHECK(b.fill(m.view()).empty());
  CHECK(m.allowed(0) == (Ids{1}));
  out->ids.clear();
  b.fill(m.view());
  CHECK(m.allowed(0) == (Ids{0, 3, 6}));

  // A preempted request resumes with its output moved into the prompt.
  auto prompt = std::make_shared<Live>(Ids{2, 2});
  auto out2 = std::make_shared<Live>(Ids{0});
  b.add(2, f.choice(), out2, prompt);
  b.fill(m.view());
  CHECK(m.allowed(2) == (Ids{1}));
  prompt->ids.push_back(0);
  out2->ids.clear();
  b.fill(m.view());
  CHECK(m.allowed(2) == (Ids{1}));
  out2->ids.push_back(1);
  b.fill(m.view());
  CHECK(m.allowed(2) == (Ids{2}));
}

void rows_move_and_go() {
  Fixture f;
  Batch b(f.vocab, 4);
  b.add(0, f.choice(), std::make_shared<Live>(Ids{3}), nullptr);
  b.add(1, f.choice(), std::make_shared<Live>(Ids{0}), nullptr);
  Mask m(4, f.vocab->words());
  b.fill(m.view());
  b.swap(0, 1);
  b.fill(m.view());
  CHECK(m.allowed(0) == (Ids{1}));
  CHECK(m.allowed(1) == (Ids{4}));
  b.move(0, 3);
  CHECK(b.occupied_rows() == (Ids{1, 3}));
  b.fill(m.view());
  CHECK(m.allowed(3) == (Ids{1}));
  b.remove(1);
  CHECK(b.occupied_rows() == (Ids{3}));
  b.add(1, f.choice(), nullptr, nullptr);  // a new request starts from the beginning
  b.fill(m.view());
  CHECK(m.allowed(1) == (Ids{0, 3, 6}));
}

void background_rows_are_kept_while_current() {
  Fixture f;
  auto probe = std::make_shared<ProbePart>(f.vocab);
  Batch b(f.vocab, 3);
  auto out0 = std::make_shared<Live>(Ids{});
  auto out1 = std::make_shared<Live>(Ids{});
  b.add(0, f.with(probe), out0, nullptr);
  b.add(1, f.with(probe), out1, nullptr);
  Mask m(3, f.vocab->words());
  CHECK(b.start_fill(m.view()) == (Ids{0, 1}));
  CHECK(b.fill_pending());
  out1->ids.push_back(2);  // row 1 gains a token while the background runs
  CHECK(b.fill(m.view()).empty());
  CHECK(!b.fill_pending());
  CHECK(probe->writes.load() == 3);  // row 0 kept, row 1 written again
  CHECK(m.allowed(0) == (Ids{0}));

  // Rows written into another mask, moved, or advanced are written again.
  b.start_fill(m.view());
  Mask other(3, f.vocab->words());
  b.fill(other.view());
  CHECK(probe->writes.load() == 7);
  CHECK(other.allowed(0) == (Ids{0}) && other.allowed(1) == (Ids{0}));
  b.start_fill(m.view());
  b.swap(0, 1);
  b.fill(m.view());
  CHECK(probe->writes.load() == 11);
  b.start_fill(m.view());
  b.advance(0, {1});
  b.fill(m.view());
  CHECK(probe->writes.load() == 14);  // row 1 kept
}

void calls_wait_for_the_background() {
  Fixture f;
  auto probe = std::make_shared<ProbePart>(f.vocab);
  auto batch = std::make_unique<Batch>(f.vocab, 2);
  Batch& b = *batch;
  b.add(0, f.with(probe), std::make_shared<Live>(), nullptr);
  Mask m(2, f.vocab->words());
  probe->set_open(false);
  CHECK(b.start_fill(m.view()) == (Ids{0}));
  CHECK(b.busy());
  std::atomic<bool> done{false};
  std::thread caller([&] {
    b.is_dead(0);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(!done.load());
  CHECK(b.busy());
  probe->set_open(true);
  caller.join();
  CHECK(done.load());
  CHECK(!b.busy());
  CHECK(m.allowed(0) == (Ids{0}));

  // A batch destroyed with a fill in flight waits for it.
  probe->set_open(false);
  b.start_fill(m.view());
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    probe->set_open(true);
  });
  batch.reset();
  opener.join();
  CHECK(probe->writes.load() == 2);
}

void errors() {
  Fixture f;
  CHECK_THROWS(Batch(f.vocab, 0), "at least one row");
  Batch b(f.vocab, 2);
  Mask m(2, f.vocab->words());

  // A token outside the vocabulary kills the row: it gets the EOS-only mask and is reported.
  auto out = std::make_shared<Live>(Ids{3, 99});
  b.add(1, f.choice(), out, nullptr);
  CHECK(b.fill(m.view()) == (Ids{1}));
  CHECK(m.allowed(1) == (Ids{kEos}));
  CHECK(b.is_dead(1));
  CHECK(!b.is_accepting(1));
  b.add(0, f.choice(), nullptr, nullptr);
  b.advance(0, {-1});
  CHECK(b.is_dead(0));
  CHECK(b.fill(m.view()) == (Ids{0, 1}));

  CHECK_THROWS(b.remove(2), "outside the batch");
  CHECK_THROWS(b.swap(-1, 0), "outside the batch");
  b.remove(0);
  CHECK_THROWS(b.is_dead(0), "holds no request");
  CHECK_THROWS(b.advance(0, {1}), "holds no request");
  auto stranger = make_vocab();
  auto foreign = std::make_shared<Constraint>(stranger, std::vector<std::shared_ptr<const Part>>{make_max_tokens(stranger, 3)});
  CHECK_THROWS(b.add(0, foreign, nullptr, nullptr), "another vocabulary");
  CHECK_THROWS(b.fill((Mask(2, 1).view())), "words per row");
  CHECK_THROWS(b.start_fill((Mask(1, f.vocab->words()).view())), "fewer rows");

  // An error in the background fill is raised by the next call that takes its result.
  auto probe = std::make_shared<ProbePart>(f.vocab);
  b.add(0, f.with(probe), std::make_shared<Live>(), nullptr);
  probe->throw_once = true;
  b.start_fill(m.view());
  CHECK_THROWS(b.fill(m.view()), "probe failed on purpose");
  CHECK(b.fill(m.view()) == (Ids{1}));
  CHECK(m.allowed(0) == (Ids{0}));
  probe->throw_once = true;
  b.start_fill(m.view());
  CHECK_THROWS(b.start_fill(m.view()), "probe failed on purpose");
  CHECK(b.fill(m.view()) == (Ids{1}));
}

}  // namespace

int main() {
  const std::vector<std::pair<const char*, std::function<void()>>> tests = {
      {"rows_follow_their_lists", rows_follow_their_lists},
      {"placeholders_wait_for_their_tokens", placeholders_wait_for_their_tokens},
      {"rewritten_lists_start_over", rewritten_lists_start_over},
      {"rows_move_and_go", rows_move_and_go},
      {"background_rows_are_kept_while_current", background_rows_are_kept_while_current},
      {"calls_wait_for_the_background", calls_wait_for_the_background},
      {"errors", errors},
  };
  for (const auto& [name, fn] : tests) {
    int before = failures;
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: unexpected exception: %s\n", name, e.what());
      ++failures;
    }
    std::printf("%s %s\n", failures == before ? "ok  " : "FAIL", name);
  }
  std::printf("%d check(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}
