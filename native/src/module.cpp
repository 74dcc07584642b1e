// Python bindings: compiled constraints, the batch of per-request states that reads vLLM's
// live token lists (native/include/batch.h), and the CPU bitmask apply. This file only reads
// Python objects, with the GIL held, and releases the GIL around the engine's parallel work
// and its waits for the batch's background fill.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <exception>
#include <memory>

#include "apply.h"
#include "batch.h"
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

// A live list-like of token IDs, read through the fast list API when it is a list. The batch
// reads it only in calls made with the GIL held, and drops it only there.
class PyTokens final : public TokenList {
 public:
  explicit PyTokens(py::object obj) : obj_(std::move(obj)) {}
  int64_t size() const override {
    Py_ssize_t n = PyList_Check(obj_.ptr()) ? PyList_GET_SIZE(obj_.ptr()) : PySequence_Size(obj_.ptr());
    if (n < 0) throw py::error_already_set();
    return n;
  }
  int32_t at(int64_t i) const override {
    if (PyList_Check(obj_.ptr())) return token_value(PyList_GET_ITEM(obj_.ptr(), i));
    py::object item = py::reinterpret_steal<py::object>(PySequence_GetItem(obj_.ptr(), i));
    if (!item) throw py::error_already_set();
    return token_value(item.ptr());
  }

 private:
  py::object obj_;
};

std::shared_ptr<const TokenList> tokens_of(py::object obj) {
  if (obj.is_none()) return nullptr;
  return std::make_shared<PyTokens>(std::move(obj));
}

MaskRows mask_rows(py::array& bitmask) {
  if (!py::isinstance<py::array_t<int32_t>>(bitmask) || bitmask.ndim() != 2 || !bitmask.writeable() ||
      bitmask.strides(1) != static_cast<py::ssize_t>(sizeof(int32_t)))
    throw ConstraintError("the bitmask must be a writable int32 array [rows, words] with contiguous rows");
  return {static_cast<Word*>(bitmask.mutable_data()), bitmask.shape(0), bitmask.shape(1),
          static_cast<size_t>(bitmask.strides(0)) / sizeof(Word)};
}

// The batch as Python sees it (native/include/batch.h): waits for the background fill and
// fills rows without the GIL, and keeps alive the array a background fill writes into.
class PyBatch {
 public:
  PyBatch(VocabPtr vocab, int32_t max_rows) : core_(std::move(vocab), max_rows) {}
  ~PyBatch() { wait(); }  // the core then only joins an idle thread

  int32_t max_rows() const { return core_.max_rows(); }

  void add(int32_t row, ConstraintPtr c, py::object output, py::object prompt) {
    wait();
    core_.add(row, std::move(c), tokens_of(std::move(output)), tokens_of(std::move(prompt)));
  }
  void remove(int32_t row) {
    wait();
    core_.remove(row);
  }
  void swap(int32_t a, int32_t b) {
    wait();
    core_.swap(a, b);
  }
  void move(int32_t src, int32_t dst) {
    wait();
    core_.move(src, dst);
  }
  void advance(int32_t row, const std::vector<int64_t>& tokens) {
    wait();
    std::vector<int32_t> narrow;
    narrow.reserve(tokens.size());
    for (int64_t t : tokens) narrow.push_back(t < 0 || t > INT32_MAX ? -1 : static_cast<int32_t>(t));
    core_.advance(row, narrow);
  }
  bool is_accepting(int32_t row) {
    wait();
    return core_.is_accepting(row);
  }
  bool is_dead(int32_t row) {
    wait();
    return core_.is_dead(row);
  }
  std::vector<int32_t> occupied_rows() {
    wait();
    return core_.occupied_rows();
  }

  std::vector<int32_t> start_fill(py::array bitmask) {
    wait();
    std::vector<int32_t> started = core_.start_fill(mask_rows(bitmask));
    if (!started.empty()) kept_ = bitmask;
    return started;
  }

  std::vector<int32_t> fill(py::array bitmask) {
    wait();
    MaskRows mask = mask_rows(bitmask);
    Batch::FillPlan plan;
    try {
      plan = core_.begin_fill(mask);  // reads the lists
    } catch (...) {
      release_kept();
      throw;
    }
    release_kept();
    {
      py::gil_scoped_release release;
      core_.run_fill(plan);
    }
    return core_.end_fill(plan);
  }

 private:
  // Waits for the background fill, if one is in flight, without the GIL.
  void wait() {
    if (!core_.busy()) return;
    py::gil_scoped_release release;
    core_.wait();
  }
  void release_kept() {
    if (!core_.fill_pending()) kept_ = py::object();
  }

  py::object kept_;
  Batch core_;
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

  py::object error = py::module_::import("serving.sampling.constraint_spec").attr("ConstraintError");
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

  py::class_<PyBatch>(m, "Batch")
      .def(py::init<VocabPtr, int32_t>(), py::arg("vocab"), py::arg("max_rows"))
      .def_property_readonly("max_rows", &PyBatch::max_rows)
      .def("add", &PyBatch::add, py::arg("row"), py::arg("constraint"), py::arg("output_ids") = py::none(),
           py::arg("prompt_ids") = py::none())
      .def("remove", &PyBatch::remove, py::arg("row"))
      .def("swap", &PyBatch::swap, py::arg("a"), py::arg("b"))
      .def("move", &PyBatch::move, py::arg("src"), py::arg("dst"))
      .def("advance", &PyBatch::advance, py::arg("row"), py::arg("tokens"))
      .def("fill", &PyBatch::fill, py::arg("bitmask"))
      .def("start_fill", &PyBatch::start_fill, py::arg("bitmask"))
      .def("occupied_rows", &PyBatch::occupied_rows)
      .def("is_accepting", &PyBatch::is_accepting, py::arg("row"))
      .def("is_dead", &PyBatch::is_dead, py::arg("row"));

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
