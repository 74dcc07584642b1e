// The one error type the engine throws for bad input; the bindings turn it into the Python
// ConstraintError (a ValueError) with the same message.
#pragma once

#include <stdexcept>
#include <string>

namespace constraints {

class ConstraintError : public std::invalid_argument {
 public:
  explicit ConstraintError(const std::string& what) : std::invalid_argument(what) {}
};

}  // namespace constraints
