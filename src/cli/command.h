// The `piper` command registry. Each subcommand lives in its own cmd_<name>.cc and registers itself with
// PIPER_REGISTER_COMMAND; main() builds the CLI11 parser from the registry, runs the chosen command and turns
// its Status into an exit code and a one-line hint on stderr (and, with --json, one JSON error object on stdout).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "piper/base/status.h"

namespace piper::cli {

struct Command {
  std::string name;
  std::string help;
  // Adds options to `sub` and returns the function that runs the command once options are parsed.
  std::function<std::function<Status()>(CLI::App* sub)> setup;
};

std::vector<Command>& command_registry();

struct CommandRegistrar {
  explicit CommandRegistrar(Command command) { command_registry().push_back(std::move(command)); }
};

// Queues one JSON object for stdout. main() prints it only when the command succeeds; when it fails, main()
// prints one error object instead ({"error": {"code", "message", "exit_code", "details": this object}}), so
// `--json` output is always exactly one JSON document (docs/reliability.md).
void print_json(const std::string& dumped);

}  // namespace piper::cli

#define PIPER_REGISTER_COMMAND(var, ...) static ::piper::cli::CommandRegistrar var{::piper::cli::Command{__VA_ARGS__}}
