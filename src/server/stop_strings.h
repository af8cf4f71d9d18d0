// User stop strings with streaming hold-back (docs/api.md §2 `stop`): text is pushed piece by piece; the matcher
// releases only text that can no longer be part of a stop string, holds back a tail that is a proper prefix of
// one, and on a full match releases the text before it and reports the stop. The stop string is never emitted.
#pragma once
#include <string>
#include <vector>

namespace lily::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Appends `text`; returns the text now safe to emit. Sets matched() when a stop string completed (the
  // returned text then ends right before it and everything after is dropped).
  std::string push(const std::string& text);
  // End of output: releases the held-back tail (no match can complete any more).
  std::string flush();
  bool matched() const { return matched_; }
  const std::string& matched_string() const { return matched_string_; }  // the stop string that matched
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
  std::string matched_string_;
};

}  // namespace lily::server
