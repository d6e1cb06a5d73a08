// `piper bench`: dispatches to the benchmarks registered in bench_registry() (cmd_bench_*.cc).
#include <algorithm>
#include <memory>

#include "piper/cli/cmd_bench.h"

namespace piper::cli {

std::vector<Command>& bench_registry() {
  static std::vector<Command> registry;
  return registry;
}

namespace {

PIPER_REGISTER_COMMAND(g_bench, "bench", "Run a benchmark (see piper bench --help for the list)", [](CLI::App* sub) {
  sub->require_subcommand(1);
  auto& registry = bench_registry();
  std::sort(registry.begin(), registry.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  auto chosen = std::make_shared<std::function<Status()>>();
  for (auto& bench : registry) {
    CLI::App* what = sub->add_subcommand(bench.name, bench.help);
    auto run = std::make_shared<std::function<Status()>>(bench.setup(what));
    what->callback([run, chosen] { *chosen = *run; });
  }
  return std::function<Status()>([chosen] {
    if (!*chosen) return invalid_argument("piper bench: name a benchmark, e.g. `piper bench comm`");
    return (*chosen)();
  });
});

}  // namespace
}  // namespace piper::cli
