// A small leveled logger to stderr. Level from LILY_LOG (debug|info|warn|error), default info.
#pragma once
#include <sstream>
#include <string>

namespace lily::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };
Level level();
void set_level(Level l);
void write(Level l, const std::string& msg);

template <typename... Args>
void msg(Level l, const Args&... args) {
  if (l < level()) return;
  std::ostringstream os;
  (os << ... << args);
  write(l, os.str());
}
template <typename... A> void debug(const A&... a) { msg(Level::debug, a...); }
template <typename... A> void info(const A&... a) { msg(Level::info, a...); }
template <typename... A> void warn(const A&... a) { msg(Level::warn, a...); }
template <typename... A> void error(const A&... a) { msg(Level::error, a...); }

}  // namespace lily::log
