// Helpers shared by `lily score` and `lily generate`: parsing a "--tokens" list, the worker thread count (the
// backend: make_device_backend, cli/backend_select.h).
#pragma once
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/backend_select.h"
#include "model/forward_cpu.h"
#include "util/check.h"
#include "util/thread_pool.h"

namespace lily::cli {

// "12 7 99" (spaces, commas or newlines) -> ids; throws lily::Error on anything else or an empty list.
inline std::vector<int32_t> parse_token_list(const std::string& text) {
  std::string s = text;
  for (char& c : s)
    if (c == ',' || c == '\n' || c == '\t') c = ' ';
  std::istringstream is(s);
  std::vector<int32_t> ids;
  std::string tok;
  while (is >> tok) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != tok.size() || v < 0 || v > INT32_MAX) fail("--tokens: \"", tok, "\" is not a token id");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) fail("--tokens: no token ids given");
  return ids;
}

// --threads: the worker thread count of the global pool (threads <= 0: all cores); set before the model loads,
// whose --check-tensors scan runs on that pool.
inline void apply_threads(int threads) {
  if (threads > 0) ThreadPool::set_global_threads(threads);
}

}  // namespace lily::cli
