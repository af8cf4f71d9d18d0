// Stop-string matching with hold-back (see stop_strings.h).
#include "server/stop_strings.h"

#include <algorithm>

namespace lily::server {

std::string StopMatcher::push(const std::string& text) {
  if (matched_) return {};
  if (stops_.empty()) return text;
  held_ += text;
  // earliest complete match
  size_t best = std::string::npos;
  for (auto& s : stops_) {
    size_t at = held_.find(s);
    if (at != std::string::npos && at < best) {
      best = at;
      matched_string_ = s;
    }
  }
  if (best != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // longest suffix of held_ that is a proper prefix of some stop string
  size_t keep = 0;
  for (auto& s : stops_) {
    size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > keep; --len)
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  if (matched_) return {};
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace lily::server
