#include "batch.h"

#include <string>
#include <utility>

#include "errors.h"
#include "thread_pool.h"

namespace constraints {

namespace {

int32_t check_rows(int32_t n) {
  if (n < 1) throw ConstraintError("a batch needs at least one row");
  return n;
}

}  // namespace

Batch::Batch(std::shared_ptr<const Vocab> vocab, int32_t max_rows)
    : vocab_(std::move(vocab)), rows_(static_cast<size_t>(check_rows(max_rows))) {}

Batch::~Batch() {
  {
    std::lock_guard<std::mutex> lock(bg_mutex_);
    bg_stop_ = true;
  }
  bg_wake_.notify_all();
  if (bg_thread_.joinable()) bg_thread_.join();  // after the fill in flight, if any
}

void Batch::add(int32_t row, std::shared_ptr<const Constraint> constraint, std::shared_ptr<const TokenList> output,
                std::shared_ptr<const TokenList> prompt) {
  wait();
  if (&constraint->vocab() != vocab_.get()) throw ConstraintError("the constraint was compiled for another vocabulary");
  Row& r = at(row);
  r = Row{};
  r.occupied = true;
  r.constraint = std::move(constraint);
  r.state = r.constraint->initial();
  r.output = std::move(output);
  r.prompt = std::move(prompt);
  if (r.prompt) r.original_prompt_len = r.prompt->size();
}

void Batch::remove(int32_t row) {
  wait();
  at(row) = Row{};
}

void Batch::swap(int32_t a, int32_t b) {
  wait();
  std::swap(at(a), at(b));
  at(a).early = at(b).early = false;  // the mask rows did not move with them
}

void Batch::move(int32_t src, int32_t dst) {
  wait();
  if (src == dst) return;
  at(dst) = std::move(at(src));
  at(dst).early = false;
  at(src) = Row{};
}

void Batch::advance(int32_t row, const std::vector<int32_t>& tokens) {
  wait();
  Row& r = occupied(row);
  r.early = false;
  for (int32_t t : tokens) r.constraint->advance(r.state, t);
}

bool Batch::is_accepting(int32_t row) {
  wait();
  Row& r = occupied(row);
  return r.constraint->accepting(r.state);
}

bool Batch::is_dead(int32_t row) {
  wait();
  return occupied(row).state.dead;
}

std::vector<int32_t> Batch::occupied_rows() {
  wait();
  return active_rows();
}

std::vector<int32_t> Batch::start_fill(const MaskRows& mask) {
  wait();
  take_background_error();
  clear_early();
  check_mask(mask);
  std::vector<int32_t> started;
  for (int32_t row : active_rows())
    if (!sync(rows_[static_cast<size_t>(row)])) started.push_back(row);
  if (started.empty()) return started;
  started_ = true;
  bg_base_ = mask.base;
  bg_stride_ = mask.stride;
  bg_rows_ = started;
  bg_dead_.assign(started.size(), 0);
  if (!bg_thread_.joinable()) bg_thread_ = std::thread([this] { background_loop(); });
  {
    std::lock_guard<std::mutex> lock(bg_mutex_);
    bg_busy_.store(true, std::memory_order_relaxed);
  }
  bg_wake_.notify_all();
  return started;
}

Batch::FillPlan Batch::begin_fill(const MaskRows& mask) {
  wait();
  check_mask(mask);
  const bool same_mask = started_ && mask.base == bg_base_ && mask.stride == bg_stride_;
  started_ = false;
  try {
    take_background_error();
  } catch (...) {
    clear_early();
    throw;
  }
  FillPlan plan;
  plan.mask = mask;
  plan.active = active_rows();
  plan.dead.assign(rows_.size(), 0);
  for (int32_t row : plan.active) {
    Row& r = rows_[static_cast<size_t>(row)];
    sync(r);
    if (same_mask && r.early && r.pending.empty() && !r.reset)
      plan.dead[static_cast<size_t>(row)] = r.early_dead;  // filled in the background, still current
    else
      plan.todo.push_back(row);
  }
  clear_early();
  plan.todo_dead.assign(plan.todo.size(), 0);
  return plan;
}

void Batch::run_fill(FillPlan& plan) { fill_rows(plan.todo, plan.mask.base, plan.mask.stride, plan.todo_dead); }

std::vector<int32_t> Batch::end_fill(const FillPlan& plan) const {
  std::vector<uint8_t> dead = plan.dead;
  for (size_t i = 0; i < plan.todo.size(); ++i) dead[static_cast<size_t>(plan.todo[i])] = plan.todo_dead[i];
  std::vector<int32_t> out;
  for (int32_t row : plan.active)
    if (dead[static_cast<size_t>(row)]) out.push_back(row);
  return out;
}

std::vector<int32_t> Batch::fill(const MaskRows& mask) {
  FillPlan plan = begin_fill(mask);
  run_fill(plan);
  return end_fill(plan);
}

bool Batch::busy() const { return bg_busy_.load(std::memory_order_acquire); }

void Batch::wait() {
  if (!busy()) return;  // the fill's writes are visible: bg_busy_ was cleared after them
  std::unique_lock<std::mutex> lock(bg_mutex_);
  bg_done_.wait(lock, [&] { return !bg_busy_.load(std::memory_order_relaxed); });
}

void Batch::check_mask(const MaskRows& mask) const {
  if (mask.words < vocab_->words())
    throw ConstraintError("the bitmask has " + std::to_string(mask.words) + " words per row; the vocabulary needs " +
                          std::to_string(vocab_->words()));
  std::vector<int32_t> active = active_rows();
  if (!active.empty() && active.back() >= mask.rows) throw ConstraintError("the bitmask has fewer rows than the batch uses");
}

std::vector<int32_t> Batch::active_rows() const {
  std::vector<int32_t> out;
  for (size_t i = 0; i < rows_.size(); ++i)
    if (rows_[i].occupied) out.push_back(static_cast<int32_t>(i));
  return out;
}

// Advances each row by its pending tokens and writes its mask row; reads no list.
void Batch::fill_rows(const std::vector<int32_t>& which, Word* base, size_t stride, std::vector<uint8_t>& dead) {
  ThreadPool::global().parallel_for(which.size(), 4, [&](size_t lo, size_t hi) {
    thread_local std::vector<Word> tmp;
    thread_local StateMask scratch;
    for (size_t i = lo; i < hi; ++i) {
      Row& r = rows_[static_cast<size_t>(which[i])];
      if (r.reset) {
        r.state = r.constraint->initial();
        r.reset = false;
      }
      for (int32_t t : r.pending) r.constraint->advance(r.state, t);
      r.pending.clear();
      dead[i] = !r.constraint->fill(r.state, base + static_cast<size_t>(which[i]) * stride, tmp, scratch);
    }
  });
}

void Batch::background_loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(bg_mutex_);
      bg_wake_.wait(lock, [&] { return bg_stop_ || bg_busy_.load(std::memory_order_relaxed); });
      if (bg_stop_ && !bg_busy_.load(std::memory_order_relaxed)) return;
    }
    std::exception_ptr error;
    try {
      fill_rows(bg_rows_, bg_base_, bg_stride_, bg_dead_);
      for (size_t i = 0; i < bg_rows_.size(); ++i) {
        Row& r = rows_[static_cast<size_t>(bg_rows_[i])];
        r.early = true;
        r.early_dead = bg_dead_[i] != 0;
      }
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(bg_mutex_);
      bg_error_ = error;
      bg_busy_.store(false, std::memory_order_release);
    }
    bg_done_.notify_all();
  }
}

void Batch::take_background_error() {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(bg_mutex_);
    std::swap(error, bg_error_);
  }
  if (error) std::rethrow_exception(error);
}

void Batch::clear_early() {
  for (Row& r : rows_) r.early = false;
}

Batch::Row& Batch::at(int32_t row) {
  if (row < 0 || static_cast<size_t>(row) >= rows_.size())
    throw ConstraintError("row " + std::to_string(row) + " is outside the batch (" + std::to_string(rows_.size()) + " rows)");
  return rows_[static_cast<size_t>(row)];
}

Batch::Row& Batch::occupied(int32_t row) {
  Row& r = at(row);
  if (!r.occupied) throw ConstraintError("row " + std::to_string(row) + " holds no request");
  return r;
}

// Reads what the output list gained since the last call (see docs/constraints.md). Returns
// whether the list ends in a placeholder: a token is coming that is not known yet. A list
// that shrank, or whose last token read before changed, was rewritten: the row starts over
// from the tokens the prompt gained since the request was added, then the whole output.
bool Batch::sync(Row& r) {
  if (!r.output) return false;
  const TokenList& out = *r.output;
  int64_t n = out.size();
  bool rewritten = n < r.consumed || (r.consumed > 0 && out.at(r.consumed - 1) != r.last);
  if (rewritten) {
    r.reset = true;
    r.pending.clear();
    r.consumed = 0;
    r.last = -1;
    if (r.prompt && r.prompt->size() >= r.original_prompt_len) {
      const TokenList& prompt = *r.prompt;
      for (int64_t i = r.original_prompt_len; i < prompt.size(); ++i) r.pending.push_back(prompt.at(i));
    }
  }
  for (int64_t i = r.consumed; i < n; ++i) {
    int32_t t = out.at(i);
    if (t < 0) return true;
    r.pending.push_back(t);
    r.consumed = i + 1;
    r.last = t;
  }
  return false;
}

}  // namespace constraints
