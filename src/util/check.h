// Error handling shared by every area: lily::Error carries a user-facing message (which file, which tensor,
// which field); LILY_CHECK throws it with the failed condition, file and line appended for debugging.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace lily {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Builds a message from any streamable pieces: fail("tensor ", name, " has shape ", s).
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw Error(os.str());
}

}  // namespace lily

#define LILY_CHECK(cond, ...)                                                         \
  do {                                                                                \
    if (!(cond)) ::lily::fail(__VA_ARGS__, " [check `" #cond "` at " __FILE__ ":", __LINE__, "]"); \
  } while (0)
