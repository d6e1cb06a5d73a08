#include "piper/runtime/exec/process_memory.h"

#include <cstdlib>  // defines __GLIBC__ under glibc
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace piper::runtime {

bool keep_freed_memory() {
#if defined(__GLIBC__)
  // mmap'ed blocks go back to the kernel on free; with none, every block comes from an arena's heap.
  const bool no_mmap = mallopt(M_MMAP_MAX, 0) == 1;
  // -1: never trim a heap's free top (mallopt(3)).
  const bool no_trim = mallopt(M_TRIM_THRESHOLD, -1) == 1;
  // Thread arenas' heaps are deleted when they empty whatever the trim threshold; the main arena's never are.
  // A rank's few threads share it (small blocks go through each thread's cache first).
  const bool one_arena = mallopt(M_ARENA_MAX, 1) == 1;
  return no_mmap && no_trim && one_arena;
#else
  return false;
#endif
}

}  // namespace piper::runtime
