// Python bindings: compiled constraints, the batch of per-request states that reads vLLM's
// live token lists, and the CPU bitmask apply. The GIL is held only to read Python lists and
// released for the parallel part of every call.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>

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

  int32_t max_rows() const { return static_cast<int32_t>(rows_.size()); }

  void add(int32_t row, ConstraintPtr c, py::object output, py::object prompt) {
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

  void remove(int32_t row) { at(row) = Row{}; }
  void swap(int32_t a, int32_t b) { std::swap(at(a), at(b)); }
  void move(int32_t src, int32_t dst) {
    if (src == dst) return;
    at(dst) = std::move(at(src));
    at(src) = Row{};
  }

  void advance(int32_t row, const std::vector<int64_t>& tokens) {
    Row& r = occupied(row);
    for (int64_t t : tokens) r.constraint->advance(r.state, t < 0 || t > INT32_MAX ? -1 : static_cast<int32_t>(t));
  }

  bool is_accepting(int32_t row) { Row& r = occupied(row); return r.constraint->accepting(r.state); }
  bool is_dead(int32_t row) { return occupied(row).state.dead; }

  std::vector<int32_t> occupied_rows() const {
    std::vector<int32_t> out;
    for (size_t i = 0; i < rows_.size(); ++i)
      if (rows_[i].occupied) out.push_back(static_cast<int32_t>(i));
    return out;
  }

  std::vector<int32_t> fill(py::array bitmask) {
    if (!py::isinstance<py::array_t<int32_t>>(bitmask) || bitmask.ndim() != 2 || !bitmask.writeable() ||
        bitmask.strides(1) != static_cast<py::ssize_t>(sizeof(int32_t)))
      throw ConstraintError("the bitmask must be a writable int32 array [rows, words] with contiguous rows");
    if (bitmask.shape(1) < vocab_->words())
      throw ConstraintError("the bitmask has " + std::to_string(bitmask.shape(1)) + " words per row; the vocabulary needs " +
                            std::to_string(vocab_->words()));
    std::vector<int32_t> active = occupied_rows();
    if (!active.empty() && active.back() >= bitmask.shape(0))
      throw ConstraintError("the bitmask has fewer rows than the batch uses");
    for (int32_t row : active) sync(rows_[static_cast<size_t>(row)]);

    Word* base = static_cast<Word*>(bitmask.mutable_data());
    size_t stride = static_cast<size_t>(bitmask.strides(0)) / sizeof(Word);
    std::vector<uint8_t> dead(active.size(), 0);
    {
      py::gil_scoped_release release;
      ThreadPool::global().parallel_for(active.size(), 4, [&](size_t lo, size_t hi) {
        thread_local std::vector<Word> tmp;
        thread_local StateMask scratch;
        for (size_t i = lo; i < hi; ++i) {
          Row& r = rows_[static_cast<size_t>(active[i])];
          if (r.reset) {
            r.state = r.constraint->initial();
            r.reset = false;
          }
          for (int32_t t : r.pending) r.constraint->advance(r.state, t);
          r.pending.clear();
          dead[i] = !r.constraint->fill(r.state, base + static_cast<size_t>(active[i]) * stride, tmp, scratch);
        }
      });
    }
    std::vector<int32_t> out;
    for (size_t i = 0; i < active.size(); ++i)
      if (dead[i]) out.push_back(active[i]);
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
  };

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
  void sync(Row& r) {
    if (r.output.is_none()) return;
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
      if (t < 0) break;
      r.pending.push_back(t);
      r.consumed = i + 1;
      r.last = t;
    }
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
