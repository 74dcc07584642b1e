// Python bindings: compiled constraints, the batch of per-request states that reads vLLM's
// live token lists, and the CPU bitmask apply. The GIL is held only to read Python lists and
// released for the parallel part of every call.
//
// A batch can also fill in the background (start_fill, then fill): the rows are read from the
// live lists at once, and the advance and mask fill run on the batch's own thread (driving the
// shared pool) while Python goes on, e.g. to the forward pass. Every other call waits for that
// work first, so rows are never touched by two threads.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "apply.h"
#include "constraint.h"
#include "errors.h"
#include "regex.h"
#include "thread_pool.h"

namespace py = pybind11;
using namespace constraints;

namespace {

// pybind11 holders cannot point to const; the engine itself only ever takes const views.
using ConstraintPtr = std::shared_ptr<Constraint>;
using PartPtr = std::shared_ptr<Part>;
using VocabPtr = std::shared_ptr<Vocab>;

PartPtr mutable_part(std::shared_ptr<const Part> p) { return std::const_pointer_cast<Part>(std::move(p)); }

int32_t token_value(PyObject* item) {
  long long v = PyLong_AsLongLong(item);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (v < 0) return -1;  // a placeholder (vLLM async scheduling): not a real token yet
  return v > INT32_MAX ? INT32_MAX : static_cast<int32_t>(v);
}

// A list-like of token IDs read through the fast list API when it is a list.
struct Tokens {
  PyObject* obj;
  Py_ssize_t size() const {
    Py_ssize_t n = PyList_Check(obj) ? PyList_GET_SIZE(obj) : PySequence_Size(obj);
    if (n < 0) throw py::error_already_set();
    return n;
  }
  int32_t at(Py_ssize_t i) const {
    if (PyList_Check(obj)) return token_value(PyList_GET_ITEM(obj, i));
    py::object item = py::reinterpret_steal<py::object>(PySequence_GetItem(obj, i));
    if (!item) throw py::error_already_set();
    return token_value(item.ptr());
  }
};

class Batch {
 public:
  Batch(VocabPtr vocab, int32_t max_rows) : vocab_(std::move(vocab)), rows_(static_cast<size_t>(check_rows(max_rows))) {}

  ~Batch() {
    {
      std::lock_guard<std::mutex> lock(bg_mutex_);
      bg_stop_ = true;
    }
    bg_wake_.notify_all();
    if (bg_thread_.joinable()) {
      py::gil_scoped_release release;  // the fill in flight, if any, needs no GIL to finish
      bg_thread_.join();
    }
  }

  int32_t max_rows() const { return static_cast<int32_t>(rows_.size()); }

  void add(int32_t row, ConstraintPtr c, py::object output, py::object prompt) {
    wait_background();
    if (&c->vocab() != vocab_.get()) throw ConstraintError("the constraint was compiled for another vocabulary");
    Row& r = at(row);
    r = Row{};
    r.occupied = true;
    r.constraint = std::move(c);
    r.state = r.constraint->initial();
    r.output = std::move(output);
    r.prompt = std::move(prompt);
    if (!r.prompt.is_none()) {
      r.original_prompt = r.prompt;
      r.original_prompt_len = Tokens{r.prompt.ptr()}.size();
    }
  }

  void remove(int32_t row) {
    wait_background();
    at(row) = Row{};
  }
  void swap(int32_t a, int32_t b) {
    wait_background();
    std::swap(at(a), at(b));
    at(a).early = at(b).early = false;  // the mask rows did not move with them
  }
  void move(int32_t src, int32_t dst) {
    wait_background();
    if (src == dst) return;
    at(dst) = std::move(at(src));
    at(dst).early = false;
    at(src) = Row{};
  }

  void advance(int32_t row, const std::vector<int64_t>& tokens) {
    wait_background();
    Row& r = occupied(row);
    r.early = false;
    for (int64_t t : tokens) r.constraint->advance(r.state, t < 0 || t > INT32_MAX ? -1 : static_cast<int32_t>(t));
  }

  bool is_accepting(int32_t row) {
    wait_background();
    Row& r = occupied(row);
    return r.constraint->accepting(r.state);
  }
  bool is_dead(int32_t row) {
    wait_background();
    return occupied(row).state.dead;
  }

  std::vector<int32_t> occupied_rows() {
    wait_background();
    return active_rows();
  }

  // Syncs every occupied row with its live lists now, then advances and fills, in the
  // background, the rows whose tokens are all known: a row whose output list ends in a
  // placeholder (a negative ID: vLLM's async scheduling, the sampled token not copied back
  // yet) is left for fill(). Returns the rows started. The next fill(bitmask) with the same
  // array waits for them and refills only rows whose lists changed in between.
  std::vector<int32_t> start_fill(py::array bitmask) {
    wait_background();
    take_background_error();
    clear_early();
    auto [base, stride] = check_bitmask(bitmask);
    std::vector<int32_t> active = active_rows();
    std::vector<int32_t> started;
    for (int32_t row : active)
      if (!sync(rows_[static_cast<size_t>(row)])) started.push_back(row);
    if (started.empty()) return started;
    bg_bitmask_ = bitmask;  // kept alive while the background writes into it
    bg_base_ = base;
    bg_stride_ = stride;
    bg_rows_ = started;
    bg_dead_.assign(started.size(), 0);
    if (!bg_thread_.joinable()) bg_thread_ = std::thread([this] { background_loop(); });
    {
      std::lock_guard<std::mutex> lock(bg_mutex_);
      bg_busy_ = true;
    }
    bg_wake_.notify_all();
    return started;
  }

  std::vector<int32_t> fill(py::array bitmask) {
    wait_background();
    auto [base, stride] = check_bitmask(bitmask);
    const bool same_array = bg_bitmask_.ptr() != nullptr && base == bg_base_ && stride == bg_stride_;
    bg_bitmask_ = py::object();
    try {
      take_background_error();
    } catch (...) {
      clear_early();
      throw;
    }
    std::vector<int32_t> active = active_rows();
    std::vector<int32_t> todo;
    std::vector<uint8_t> dead(rows_.size(), 0);
    for (int32_t row : active) {
      Row& r = rows_[static_cast<size_t>(row)];
      sync(r);
      if (same_array && r.early && r.pending.empty() && !r.reset)
        dead[static_cast<size_t>(row)] = r.early_dead;  // filled in the background, still current
      else
        todo.push_back(row);
    }
    clear_early();
    std::vector<uint8_t> todo_dead(todo.size(), 0);
    {
      py::gil_scoped_release release;
      fill_rows(todo, base, stride, todo_dead);
    }
    for (size_t i = 0; i < todo.size(); ++i) dead[static_cast<size_t>(todo[i])] = todo_dead[i];
    std::vector<int32_t> out;
    for (int32_t row : active)
      if (dead[static_cast<size_t>(row)]) out.push_back(row);
    return out;
  }

 private:
  struct Row {
    bool occupied = false;
    ConstraintPtr constraint;
    RequestState state;
    py::object output = py::none();
    py::object prompt = py::none();
    py::object original_prompt = py::none();
    Py_ssize_t original_prompt_len = 0;
    Py_ssize_t consumed = 0;  // tokens of `output` fed so far
    int32_t last = -1;        // the last of them
    std::vector<int32_t> pending;
    bool reset = false;
    bool early = false;       // its mask row was written by the background fill and is current
    bool early_dead = false;  // what that fill reported
  };

  std::pair<Word*, size_t> check_bitmask(py::array& bitmask) {
    if (!py::isinstance<py::array_t<int32_t>>(bitmask) || bitmask.ndim() != 2 || !bitmask.writeable() ||
        bitmask.strides(1) != static_cast<py::ssize_t>(sizeof(int32_t)))
      throw ConstraintError("the bitmask must be a writable int32 array [rows, words] with contiguous rows");
    if (bitmask.shape(1) < vocab_->words())
      throw ConstraintError("the bitmask has " + std::to_string(bitmask.shape(1)) + " words per row; the vocabulary needs " +
                            std::to_string(vocab_->words()));
    std::vector<int32_t> active = active_rows();
    if (!active.empty() && active.back() >= bitmask.shape(0))
      throw ConstraintError("the bitmask has fewer rows than the batch uses");
    return {static_cast<Word*>(bitmask.mutable_data()), static_cast<size_t>(bitmask.strides(0)) / sizeof(Word)};
  }

  std::vector<int32_t> active_rows() const {
    std::vector<int32_t> out;
    for (size_t i = 0; i < rows_.size(); ++i)
      if (rows_[i].occupied) out.push_back(static_cast<int32_t>(i));
    return out;
  }

  // Advances each row by its pending tokens and writes its mask row; no GIL needed.
  void fill_rows(const std::vector<int32_t>& which, Word* base, size_t stride, std::vector<uint8_t>& dead) {
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

  void background_loop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(bg_mutex_);
        bg_wake_.wait(lock, [&] { return bg_stop_ || bg_busy_; });
        if (bg_stop_ && !bg_busy_) return;
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
        bg_busy_ = false;
      }
      bg_done_.notify_all();
    }
  }

  // Waits (without the GIL) for the background fill, if one is in flight.
  void wait_background() {
    std::unique_lock<std::mutex> lock(bg_mutex_);
    if (!bg_busy_) return;
    lock.unlock();
    py::gil_scoped_release release;
    lock.lock();
    bg_done_.wait(lock, [&] { return !bg_busy_; });
  }

  void take_background_error() {
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(bg_mutex_);
      std::swap(error, bg_error_);
    }
    if (error) std::rethrow_exception(error);
  }

  void clear_early() {
    for (Row& r : rows_) r.early = false;
  }

  static int32_t check_rows(int32_t n) {
    if (n < 1) throw ConstraintError("a batch needs at least one row");
    return n;
  }
  Row& at(int32_t row) {
    if (row < 0 || static_cast<size_t>(row) >= rows_.size())
      throw ConstraintError("row " + std::to_string(row) + " is outside the batch (" + std::to_string(rows_.size()) + " rows)");
    return rows_[static_cast<size_t>(row)];
  }
  Row& occupied(int32_t row) {
    Row& r = at(row);
    if (!r.occupied) throw ConstraintError("row " + std::to_string(row) + " holds no request");
    return r;
  }

  // Reads what the live output list gained since the last call (see docs/constraints.md).
  // Returns whether the list ends in a placeholder: a token is coming that is not known yet.
  bool sync(Row& r) {
    if (r.output.is_none()) return false;
    Tokens out{r.output.ptr()};
    Py_ssize_t n = out.size();
    bool rewritten = n < r.consumed || (r.consumed > 0 && out.at(r.consumed - 1) != r.last);
    if (rewritten) {
      r.reset = true;
      r.pending.clear();
      r.consumed = 0;
      r.last = -1;
      if (!r.prompt.is_none() && prompt_kept(r)) {
        Tokens prompt{r.prompt.ptr()};
        for (Py_ssize_t i = r.original_prompt_len; i < prompt.size(); ++i) r.pending.push_back(prompt.at(i));
      }
    }
    for (Py_ssize_t i = r.consumed; i < n; ++i) {
      int32_t t = out.at(i);
      if (t < 0) return true;
      r.pending.push_back(t);
      r.consumed = i + 1;
      r.last = t;
    }
    return false;
  }

  // Whether the current prompt still starts with the prompt the request was added with.
  bool prompt_kept(const Row& r) {
    Tokens now{r.prompt.ptr()};
    if (now.size() < r.original_prompt_len) return false;
    if (r.prompt.ptr() == r.original_prompt.ptr()) return true;  // same list, only appended to
    Tokens before{r.original_prompt.ptr()};
    if (before.size() < r.original_prompt_len) return false;
    for (Py_ssize_t i = 0; i < r.original_prompt_len; ++i)
      if (now.at(i) != before.at(i)) return false;
    return true;
  }

  VocabPtr vocab_;
  std::vector<Row> rows_;

  // The background fill. Its fields other than the flags are set by start_fill before the
  // thread is woken and read by Python calls only after wait_background().
  std::thread bg_thread_;
  std::mutex bg_mutex_;
  std::condition_variable bg_wake_;
  std::condition_variable bg_done_;
  bool bg_busy_ = false;
  bool bg_stop_ = false;
  std::exception_ptr bg_error_;
  py::object bg_bitmask_;
  Word* bg_base_ = nullptr;
  size_t bg_stride_ = 0;
  std::vector<int32_t> bg_rows_;
  std::vector<uint8_t> bg_dead_;
};

DType dtype_from(const std::string& name) {
  if (name == "float32") return DType::kFloat32;
  if (name == "float64") return DType::kFloat64;
  if (name == "float16") return DType::kFloat16;
  if (name == "bfloat16") return DType::kBFloat16;
  throw ConstraintError("logits of dtype " + name + " are not supported");
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "Native constraint engine: compiled constraints, batched mask fill and CPU apply.";

  py::object error = py::module_::import("serving.constraints.spec").attr("ConstraintError");
  static py::handle error_type = error.release();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ConstraintError& e) {
      PyErr_SetString(error_type.ptr(), e.what());
    }
  });

  py::class_<Vocab, VocabPtr>(m, "Vocab")
      .def(py::init([](const std::vector<py::bytes>& tokens, const std::vector<int32_t>& eos, int32_t size) {
             std::vector<std::string> raw(tokens.begin(), tokens.end());
             py::gil_scoped_release release;
             return std::make_shared<Vocab>(raw, eos, size);
           }),
           py::arg("tokens"), py::arg("eos_ids"), py::arg("size"))
      .def_property_readonly("n_tokens", &Vocab::n_tokens)
      .def_property_readonly("size", &Vocab::size)
      .def_property_readonly("words", &Vocab::words)
      .def_property_readonly("trie_nodes", [](const Vocab& v) { return v.trie().nodes(); });

  py::class_<Part, PartPtr>(m, "Part")
      .def_property_readonly("kind", &Part::kind)
      .def_property_readonly("memory_bytes", &Part::memory_bytes);

  m.def(
      "choice",
      [](VocabPtr vocab, const std::vector<py::bytes>& strings) {
        std::vector<std::string> raw(strings.begin(), strings.end());
        py::gil_scoped_release release;
        return mutable_part(make_choice(std::move(vocab), std::move(raw)));
      },
      py::arg("vocab"), py::arg("strings"));
  m.def(
      "regex",
      [](VocabPtr vocab, const std::string& pattern) {
        py::gil_scoped_release release;
        return mutable_part(make_regex(std::move(vocab), pattern));
      },
      py::arg("vocab"), py::arg("pattern"));
  m.def(
      "token_set",
      [](VocabPtr vocab, const std::vector<int64_t>& ids, bool banned) {
        std::vector<int32_t> narrow;
        for (int64_t id : ids) narrow.push_back(id < 0 || id > INT32_MAX ? INT32_MAX : static_cast<int32_t>(id));
        return mutable_part(make_token_set(std::move(vocab), narrow, banned));
      },
      py::arg("vocab"), py::arg("ids"), py::arg("banned"));
  m.def(
      "max_tokens", [](VocabPtr vocab, int32_t limit) { return mutable_part(make_max_tokens(std::move(vocab), limit)); },
      py::arg("vocab"), py::arg("limit"));
  m.def("check_regex", [](const std::string& pattern) { check_regex(pattern); }, py::arg("pattern"));

  py::class_<Constraint, ConstraintPtr>(m, "Constraint")
      .def(py::init([](VocabPtr vocab, const std::vector<PartPtr>& parts) {
             if (parts.empty()) throw ConstraintError("a constraint needs at least one part");
             std::vector<std::shared_ptr<const Part>> kept(parts.begin(), parts.end());
             for (const auto& part : kept)
               if (part == nullptr || &part->vocab() != vocab.get())
                 throw ConstraintError("every part must be compiled for the constraint's vocabulary");
             return std::make_shared<Constraint>(std::move(vocab), std::move(kept));
           }),
           py::arg("vocab"), py::arg("parts"))
      .def_property_readonly("kinds", [](const Constraint& c) {
        std::vector<std::string> out;
        for (const auto& p : c.parts()) out.push_back(p->kind());
        return out;
      });

  py::class_<Batch>(m, "Batch")
      .def(py::init<VocabPtr, int32_t>(), py::arg("vocab"), py::arg("max_rows"))
      .def_property_readonly("max_rows", &Batch::max_rows)
      .def("add", &Batch::add, py::arg("row"), py::arg("constraint"), py::arg("output_ids") = py::none(),
           py::arg("prompt_ids") = py::none())
      .def("remove", &Batch::remove, py::arg("row"))
      .def("swap", &Batch::swap, py::arg("a"), py::arg("b"))
      .def("move", &Batch::move, py::arg("src"), py::arg("dst"))
      .def("advance", &Batch::advance, py::arg("row"), py::arg("tokens"))
      .def("fill", &Batch::fill, py::arg("bitmask"))
      .def("start_fill", &Batch::start_fill, py::arg("bitmask"))
      .def("occupied_rows", &Batch::occupied_rows)
      .def("is_accepting", &Batch::is_accepting, py::arg("row"))
      .def("is_dead", &Batch::is_dead, py::arg("row"));

  m.def(
      "apply_bitmask",
      [](uintptr_t data, const std::string& dtype, int64_t rows, int64_t cols, int64_t row_stride, py::array_t<int32_t> mask,
         std::optional<std::vector<int64_t>> which) {
        if (mask.ndim() != 2 || mask.strides(1) != static_cast<py::ssize_t>(sizeof(int32_t)))
          throw ConstraintError("the bitmask must be an int32 array [rows, words] with contiguous rows");
        LogitsView logits{reinterpret_cast<void*>(data), dtype_from(dtype), rows, cols, row_stride};
        BitmaskView view{reinterpret_cast<const Word*>(mask.data()), mask.shape(0), mask.shape(1),
                         mask.strides(0) / static_cast<py::ssize_t>(sizeof(int32_t))};
        int64_t n = which ? static_cast<int64_t>(which->size()) : std::min(rows, view.rows);
        py::gil_scoped_release release;
        apply_bitmask(logits, view, which ? which->data() : nullptr, n);
      },
      py::arg("data"), py::arg("dtype"), py::arg("rows"), py::arg("cols"), py::arg("row_stride"), py::arg("bitmask"),
      py::arg("which") = py::none());

  m.def("threads", [] { return ThreadPool::global().size(); });
}
