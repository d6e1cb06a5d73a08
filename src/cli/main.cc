#include <algorithm>
#include <cstdio>
#include <iostream>

#include "piper/base/log.h"
#include "piper/cli/command.h"

namespace piper::cli {

std::vector<Command>& command_registry() {
  static std::vector<Command> registry;
  return registry;
}

void print_json(const std::string& dumped) { std::cout << dumped << std::endl; }

}  // namespace piper::cli

int main(int argc, char** argv) {
  using namespace piper;
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
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  LogLevel level;
  if (!parse_log_level(log_level, &level)) {
    std::fprintf(stderr, "piper: --log-level '%s' is not one of debug|info|warn|error|off\n", log_level.c_str());
    return 2;
  }
  set_log_level(level);
  Status status = to_run ? to_run() : invalid_argument("no command given; see piper --help");
  if (!status.ok()) {
    std::fprintf(stderr, "piper: error: %s\n", status.message().c_str());
    return status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kNotFound ? 2 : 1;
  }
  return 0;
}
