// tilejit::Error: the one exception type every bad input raises.
// Kept in its own header so that every layer of the library can throw it
// without pulling in the whole public API.
#pragma once

#include <exception>
#include <string>
#include <utility>

namespace tilejit {

class Error : public std::exception {
 public:
  explicit Error(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

}  // namespace tilejit
