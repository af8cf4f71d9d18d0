// `lily generate` with text input on the demo checkpoint (tiny random weights, real Qwen3 tokenizer, Qwen3.6
// chat template): --prompt and --prompt --chat must feed exactly the ids that the tokenizer / the rendered
// template give, so their greedy output equals `--tokens` with those ids.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "chat/template.h"
#include "server/served_model.h"
#include "tokenizer/tokenizer.h"

using namespace lily;

namespace {

std::string run(const std::string& args) {
  const std::string cmd = std::string(LILY_BINARY_DIR) + "/lily generate " + args + " --device cpu 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr) << cmd;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << cmd;
  return out;
}

std::string join(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s;
}

}  // namespace

TEST(CliGenerate, TextAndChatPromptsFeedTheTokenizersIds) {
  const std::string dir = server::make_demo_model();
  const Tokenizer tok = Tokenizer::load(dir);
  const std::string common = "--model " + dir + " --max-tokens 6 --temperature 0 --ignore-eos --print-ids";
  const std::string text = "Ciao, come stai? Réponds en français 🎉";

  const std::string by_text = run(common + " --prompt '" + text + "'");
  const std::string by_ids = run(common + " --tokens '" + join(tok.encode(text)) + "'");
  EXPECT_EQ(by_text, by_ids);
  EXPECT_FALSE(by_text.empty());

  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "user"}, {"content", text}});
  const std::string rendered = chat::ChatTemplate::load_from_dir(dir).render(
      messages, nlohmann::ordered_json(), true, nlohmann::ordered_json::object());
  EXPECT_EQ(run(common + " --chat --prompt '" + text + "'"),
            run(common + " --tokens '" + join(tok.encode(rendered)) + "'"));

  // Without --print-ids the text is printed: the decoded generated ids.
  const std::string shown = run("--model " + dir + " --max-tokens 6 --temperature 0 --ignore-eos --prompt '" + text + "'");
  std::vector<int32_t> ids;
  for (size_t i = 0, j; i < by_ids.size(); i = j + 1) {
    j = by_ids.find_first_of(" \n", i);
    if (j == std::string::npos) j = by_ids.size();
    if (j > i) ids.push_back(std::stoi(by_ids.substr(i, j - i)));
  }
  EXPECT_EQ(shown, tok.decode(ids, /*skip_special=*/true) + "\n");
}

TEST(CliBench, ConcurrencyRunsEveryClientInTheSameSteps) {
  const std::string cmd = std::string(LILY_BINARY_DIR) + "/lily bench --model " + LILY_SOURCE_DIR +
                          "/tests/data/golden/hf --concurrency 1,3 --gen-tokens 8 --prompt-tokens 5 --json 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << cmd;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j["points"].size(), 2u) << out;
  EXPECT_EQ(j["points"][1]["clients"], 3);
  EXPECT_EQ(j["points"][1]["steps"], 8);  // the prompts in one step, then every step decodes all three
  EXPECT_DOUBLE_EQ(j["points"][1]["mean_batch"].get<double>(), 3.0);
  EXPECT_GT(j["points"][1]["total_tok_per_s"].get<double>(), 0);
}
