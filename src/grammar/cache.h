// Compiled grammars cached by their source (kind + text), so a schema repeated across requests compiles once.
#pragma once
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "grammar/token_mask.h"

namespace lily::grammar {

class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const Vocab> vocab, size_t capacity = 64) : vocab_(std::move(vocab)), capacity_(capacity) {}
  // `key` identifies the grammar (e.g. "json_schema:" + the schema's JSON text); `build` makes the IR on a miss.
  // Compiles outside the lock; GrammarError from `build` propagates (and is not cached).
  template <typename Build>
  std::shared_ptr<const CompiledGrammar> get(const std::string& key, Build&& build) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second.second);
        ++hits_;
        return it->second.first;
      }
    }
    auto compiled = CompiledGrammar::compile(build(), vocab_);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second.first;
    lru_.push_front(key);
    map_[key] = {compiled, lru_.begin()};
    while (map_.size() > capacity_) {
      map_.erase(lru_.back());
      lru_.pop_back();
    }
    return compiled;
  }
  const std::shared_ptr<const Vocab>& vocab() const { return vocab_; }
  size_t hits() const { std::lock_guard<std::mutex> lock(mu_); return hits_; }

 private:
  std::shared_ptr<const Vocab> vocab_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::string> lru_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<const CompiledGrammar>, std::list<std::string>::iterator>> map_;
  size_t hits_ = 0;
};

}  // namespace lily::grammar
