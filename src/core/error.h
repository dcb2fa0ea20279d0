// Errors: one exception type and a check macro whose message carries the offending values.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace ft {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An allocation the device (or the host) could not serve: a training run records it as such,
// so that a baseline that does not fit is a result rather than a broken log.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// Concatenates any streamable values: str("seq-len ", 4096, " > context ", 1024).
template <class... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

}  // namespace ft

// FT_CHECK(cond, parts...) throws ft::Error whose message is the concatenated parts.
#define FT_CHECK(cond, ...)                                 \
  do {                                                      \
    if (!(cond)) throw ::ft::Error(::ft::str(__VA_ARGS__)); \
  } while (0)

// FT_ASSERT is for internal invariants (programming errors), not for user input.
#define FT_ASSERT(cond)                                                                         \
  do {                                                                                          \
    if (!(cond))                                                                                \
      throw ::ft::Error(::ft::str("internal error: ", #cond, " at ", __FILE__, ":", __LINE__)); \
  } while (0)
