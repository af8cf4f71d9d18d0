// lily: one binary, several subcommands (info, score, generate, synth, tokenize, render, serve, bench, ...).
#include <algorithm>
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "util/check.h"

namespace lily::cli {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace lily::cli

int main(int argc, char** argv) {
  using namespace lily::cli;
  CLI::App app{"lily: a single-model inference engine for Qwen3.6-35B-A3B"};
  app.require_subcommand(1);
  auto& cmds = registry();
  std::sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  std::function<int()> action;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    auto run = c.setup(*sub);
    sub->callback([&action, run] { action = run; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return action ? action() : 0;
  } catch (const lily::Error& e) {
    std::fprintf(stderr, "lily: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lily: internal error: %s\n", e.what());
    return 2;
  }
}
