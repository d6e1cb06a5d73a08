// Invariant checks (bugs, not user errors): PIPER_CHECK is always on, PIPER_DCHECK only in debug builds.
//
// A failed check prints "piper[rank R]: CHECK failed at file:line: expr (message)" to stderr, runs the
// registered fatal hook (the communication layer registers one that aborts the job so that no other rank
// hangs waiting for this one), then aborts. Use Status for anything a user can cause.
#pragma once

#include <sstream>
#include <string>

namespace piper {

// Called once, from the failing thread, before abort(). Must not throw. Replaces any previous hook.
using FatalHook = void (*)();
void set_fatal_hook(FatalHook hook);

// The rank printed in check and log messages; -1 (the default) prints no rank.
void set_process_rank(int rank);
int process_rank();

[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& message);

namespace detail {
// Streams the optional message arguments of PIPER_CHECK(cond, a, b, ...).
template <typename... Args>
std::string check_message(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace piper

#define PIPER_CHECK(cond, ...)                                                                          \
  do {                                                                                                  \
    if (!(cond)) [[unlikely]]                                                                           \
      ::piper::check_failed(__FILE__, __LINE__, #cond, ::piper::detail::check_message("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

#define PIPER_CHECK_OK(status_expr)                                                          \
  do {                                                                                       \
    const ::piper::Status& piper_check_status_ = (status_expr);                              \
    if (!piper_check_status_.ok()) [[unlikely]]                                              \
      ::piper::check_failed(__FILE__, __LINE__, #status_expr, piper_check_status_.to_string()); \
  } while (0)

#ifdef NDEBUG
#define PIPER_DCHECK(cond, ...) \
  do {                          \
  } while (false && (cond))
#else
#define PIPER_DCHECK(cond, ...) PIPER_CHECK(cond __VA_OPT__(, ) __VA_ARGS__)
#endif
