// The batch of per-request rows: each row's constraint state, kept in step with the request's
// live token lists, and the mask fill over all rows, optionally started in the background.
//
// Nothing here knows about Python. The lists are read through TokenList, which the bindings
// implement over vLLM's Python lists; every call that reads them (add, start_fill,
// begin_fill) must be made by the thread that may read them (in the bindings: with the GIL
// held). advance, fill and the rest only touch row state, so the bindings run them without it.
//
// start_fill reads the lists at once and runs the advance and mask fill of the rows whose
// tokens are all known on the batch's own thread (which drives the shared pool) while the
// caller goes on. Every other call waits for that work first, so rows are never touched by
// two threads; the next fill with the same mask array keeps the rows written in the background
// that are still current.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "constraint.h"
#include "vocab.h"

namespace constraints {

// A request's live list of token IDs, which its owner appends to, rewrites and cuts back
// between calls. at(i) is an ID, or a negative value for a placeholder: a token that has been
// scheduled but whose ID is not known yet (vLLM's async scheduling).
class TokenList {
 public:
  virtual ~TokenList() = default;
  virtual int64_t size() const = 0;
  virtual int32_t at(int64_t i) const = 0;
};

// Rows of a packed bitmask: row r starts at base + r * stride.
struct MaskRows {
  Word* base = nullptr;
  int64_t rows = 0;
  int64_t words = 0;
  size_t stride = 0;  // in words
};

class Batch {
 public:
  Batch(std::shared_ptr<const Vocab> vocab, int32_t max_rows);
  ~Batch();
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  int32_t max_rows() const { return static_cast<int32_t>(rows_.size()); }

  // Puts a new request in `row`. `output` is the list of its generated tokens, which the
  // fills read; `prompt` its prompt, whose tokens past the length it has now are replayed
  // when the output is rewritten (a preempted request resumes with its output in the prompt).
  // Either may be null.
  void add(int32_t row, std::shared_ptr<const Constraint> constraint, std::shared_ptr<const TokenList> output,
           std::shared_ptr<const TokenList> prompt);
  void remove(int32_t row);
  void swap(int32_t a, int32_t b);
  void move(int32_t src, int32_t dst);
  // Feeds tokens the caller knows of (for rows without an output list). A negative token
  // makes the row dead, as does any token outside the vocabulary.
  void advance(int32_t row, const std::vector<int32_t>& tokens);
  bool is_accepting(int32_t row);
  bool is_dead(int32_t row);
  std::vector<int32_t> occupied_rows();

  // Syncs every occupied row with its lists now, then advances and fills, in the background,
  // the rows whose tokens are all known: a row whose output list ends in a placeholder is left
  // for the fill. Returns the rows started. The mask must stay valid until the next fill, or
  // until the batch is destroyed if none comes.
  std::vector<int32_t> start_fill(const MaskRows& mask);
  // Whether rows started by start_fill still wait for a fill to take them.
  bool fill_pending() const { return started_; }

  // Syncs every occupied row, advances it and writes its mask row; returns the rows that are
  // dead (their rows allow only EOS). Rows written by start_fill into the same mask whose
  // lists have not changed since are kept as they are. Made of three steps so that the part
  // in the middle, which reads no list, can run where reading them is not allowed.
  struct FillPlan {
    MaskRows mask;
    std::vector<int32_t> active;
    std::vector<int32_t> todo;
    std::vector<uint8_t> dead;       // per row of the batch
    std::vector<uint8_t> todo_dead;  // per entry of todo
  };
  FillPlan begin_fill(const MaskRows& mask);
  void run_fill(FillPlan& plan);
  std::vector<int32_t> end_fill(const FillPlan& plan) const;
  std::vector<int32_t> fill(const MaskRows& mask);

  // Whether a background fill is in flight, and waiting for it. Every call waits by itself;
  // the bindings call wait() first where waiting must not hold the GIL.
  bool busy() const;
  void wait();

 private:
  struct Row {
    bool occupied = false;
    std::shared_ptr<const Constraint> constraint;
    RequestState state;
    std::shared_ptr<const TokenList> output;
    std::shared_ptr<const TokenList> prompt;
    int64_t original_prompt_len = 0;
    int64_t consumed = 0;  // tokens of `output` fed so far
    int32_t last = -1;     // the last of them
    std::vector<int32_t> pending;
    bool reset = false;
    bool early = false;       // its mask row was written by the background fill and is current
    bool early_dead = false;  // what that fill reported
  };

  void check_mask(const MaskRows& mask) const;
  std::vector<int32_t> active_rows() const;
  void fill_rows(const std::vector<int32_t>& which, Word* base, size_t stride, std::vector<uint8_t>& dead);
  void background_loop();
  void take_background_error();
  void clear_early();
  Row& at(int32_t row);
  Row& occupied(int32_t row);
  bool sync(Row& r);

  std::shared_ptr<const Vocab> vocab_;
  std::vector<Row> rows_;

  // The background fill. Its fields other than the flags are set by start_fill before the
  // thread is woken and read by other calls only after wait().
  std::thread bg_thread_;
  mutable std::mutex bg_mutex_;
  std::condition_variable bg_wake_;
  std::condition_variable bg_done_;
  std::atomic<bool> bg_busy_{false};  // written under bg_mutex_; read without it to skip the lock
  bool bg_stop_ = false;
  std::exception_ptr bg_error_;
  bool started_ = false;  // set by a start_fill that started rows, cleared by the next fill
  Word* bg_base_ = nullptr;
  size_t bg_stride_ = 0;
  std::vector<int32_t> bg_rows_;
  std::vector<uint8_t> bg_dead_;
};

}  // namespace constraints
