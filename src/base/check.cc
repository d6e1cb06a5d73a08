#include "piper/base/check.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace piper {
namespace {
std::atomic<FatalHook> g_fatal_hook{nullptr};
std::atomic<int> g_rank{-1};
}  // namespace

void set_fatal_hook(FatalHook hook) { g_fatal_hook.store(hook); }
void set_process_rank(int rank) { g_rank.store(rank); }
int process_rank() { return g_rank.load(); }

void check_failed(const char* file, int line, const char* expr, const std::string& message) {
  int rank = g_rank.load();
  if (rank >= 0) {
    std::fprintf(stderr, "piper[rank %d]: CHECK failed at %s:%d: %s%s%s%s\n", rank, file, line, expr,
                 message.empty() ? "" : " (", message.c_str(), message.empty() ? "" : ")");
  } else {
    std::fprintf(stderr, "piper: CHECK failed at %s:%d: %s%s%s%s\n", file, line, expr, message.empty() ? "" : " (",
                 message.c_str(), message.empty() ? "" : ")");
  }
  std::fflush(stderr);
  if (FatalHook hook = g_fatal_hook.exchange(nullptr)) hook();
  std::abort();
}

}  // namespace piper
