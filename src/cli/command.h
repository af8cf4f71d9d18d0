// Subcommands of the one `lily` binary. Each src/cli/cmd_*.cpp registers itself with a static
// CommandRegistrar; main() builds the CLI11 app from the registry, so adding a command edits no other file.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace lily::cli {

struct Command {
  std::string name;
  std::string help;
  // Adds options to `sub` and returns the action run when the subcommand is chosen (returns exit code).
  std::function<std::function<int()>(CLI::App& sub)> setup;
};

std::vector<Command>& registry();

struct CommandRegistrar {
  explicit CommandRegistrar(Command c) { registry().push_back(std::move(c)); }
};

}  // namespace lily::cli
