#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>

#include "piper/base/files.h"
#include "piper/base/json.h"
#include "piper/base/log.h"
#include "piper/base/strings.h"
#include "piper/cli/command.h"
#include "piper/comm/launch.h"

namespace piper::cli {
namespace {

// The command's JSON result, held back until its Status is known (see print_json in command.h).
std::optional<std::string>& pending_json() {
  static std::optional<std::string> pending;
  return pending;
}

bool wants_json(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) return true;
  }
  return false;
}

// Prints the final error: one line on stderr, and with --json one error object on stdout (docs/reliability.md,
// "The JSON error object"); any JSON the command produced before failing goes under error.details. A rank of a job
// `piper train --ranks R` launched prints no object: the launcher prints the job's one (comm/launch.h).
int report_error(StatusCode code, const std::string& message_in, bool json, int exit_code) {
  const std::string message = elide_long_words(message_in);
  std::fprintf(stderr, "piper: error: %s\n", message.c_str());
  if (json && !comm::launcher_reports()) {
    Json error{{"code", to_lower(status_code_name(code))}, {"message", message}, {"exit_code", exit_code}};
    if (pending_json().has_value()) {
      try {
        error["details"] = Json::parse(*pending_json());
      } catch (const Json::exception&) {
        error["details"] = *pending_json();
      }
    }
    std::cout << Json{{"error", error}}.dump(2) << std::endl;
  }
  return exit_code;
}

}  // namespace

std::vector<Command>& command_registry() {
  static std::vector<Command> registry;
  return registry;
}

void print_json(const std::string& dumped) {
  std::optional<std::string>& pending = pending_json();
  pending = pending.has_value() ? *pending + "\n" + dumped : dumped;
}

}  // namespace piper::cli

int main(int argc, char** argv) {
  using namespace piper;
  const bool json = cli::wants_json(argc, argv);
  CLI::App app{"piper: plan, simulate and run distributed Mixture-of-Experts training"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug|info|warn|error|off")->capture_default_str();

  auto& registry = cli::command_registry();
  std::sort(registry.begin(), registry.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::function<Status()> to_run;
  for (auto& cmd : registry) {
    CLI::App* sub = app.add_subcommand(cmd.name, cmd.help);
    auto run = std::make_shared<std::function<Status()>>(cmd.setup(sub));
    sub->callback([run, &to_run] { to_run = *run; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line (CLI11's own report adds "Run with --help"), and the JSON error object with --json.
    return cli::report_error(StatusCode::kInvalidArgument, std::string(e.what()) + " (see piper --help)", json, 2);
  }
  LogLevel level;
  if (!parse_log_level(log_level, &level)) {
    return cli::report_error(StatusCode::kInvalidArgument,
                             "--log-level '" + log_level + "' is not one of debug|info|warn|error|off", json, 2);
  }
  set_log_level(level);
  Status status = to_run ? to_run() : invalid_argument("no command given; see piper --help");
  if (!status.ok()) {
    const int rc = status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kNotFound ? 2 : 1;
    return cli::report_error(status.code(), status.message(), json, rc);
  }
  if (cli::pending_json().has_value()) std::cout << *cli::pending_json() << std::endl;
  return 0;
}
