#include "piper/base/json.h"
#include "piper/cli/command.h"

namespace piper::cli {
namespace {

constexpr const char* kVersion = "0.1.0";

PIPER_REGISTER_COMMAND(g_version, "version", "Print the Piper version", [](CLI::App* sub) {
  auto json = std::make_shared<bool>(false);
  sub->add_flag("--json", *json, "print one JSON object");
  return std::function<Status()>([json] {
    if (*json) {
      print_json(Json{{"version", kVersion}}.dump());
    } else {
      std::printf("piper %s\n", kVersion);
    }
    return ok_status();
  });
});

}  // namespace
}  // namespace piper::cli
