// `lily chat --demo`: starts its own server on a free loopback port, chats over two turns read from stdin
// (the second reuses the first through the prefix cache), and stops the server when the input ends.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "server/http_client.h"

TEST(CliChat, DemoSessionTwoTurnsThenStopsItsServer) {
  const std::string cmd = "printf 'Hello there\\nSecond turn\\n/quit\\n' | timeout 170 " + std::string(LILY_BINARY_DIR) +
                          "/lily chat --demo --max-tokens 6 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  // One statistics line per reply; the second turn's prompt shares the first turn's tokens.
  std::regex stats(R"(\[(\d+) tokens, [0-9.]+ tok/s, first token [0-9.]+ s, (\d+)/(\d+) prompt tokens cached\])");
  std::vector<std::smatch> turns;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), stats); it != std::sregex_iterator(); ++it)
    turns.push_back(*it);
  ASSERT_EQ(turns.size(), 2u) << out;
  EXPECT_EQ(turns[0][1].str(), "6");
  EXPECT_EQ(turns[0][2].str(), "0");
  EXPECT_GT(std::stoi(turns[1][2].str()), 0) << out;
  EXPECT_LT(std::stoi(turns[1][2].str()), std::stoi(turns[1][3].str()));
  // The session's server is gone: the log names its port, which must no longer answer.
  std::smatch url;
  ASSERT_TRUE(std::regex_search(out, url, std::regex(R"(http://127\.0\.0\.1:(\d+))"))) << out;
  lily::server::HttpClient cli("127.0.0.1", std::stoi(url[1].str()));
  cli.set_connect_timeout(2);
  EXPECT_FALSE(cli.get("/health"));
}
