// tilejit::Error: the exception type every bad input raises, and
// tilejit::InternalError (a kind of Error): a failure inside tilejit on an
// input it accepted, e.g. an emitter that fails on a descriptor its checks
// let through. Callers that fall back to another path on an Error they
// expect never swallow an InternalError.
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

class InternalError : public Error {
 public:
  explicit InternalError(std::string message)
      : Error("tilejit internal error (please report): " + std::move(message)) {}
};

}  // namespace tilejit
