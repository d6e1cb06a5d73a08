// runtime::keep_freed_memory (runtime/exec/process_memory.h): a large block freed by one step is reused by the
// next without faulting its pages in again.
#include "piper/runtime/exec/process_memory.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

// Under a sanitizer malloc is the sanitizer's, which refuses mallopt.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PIPER_SANITIZER_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define PIPER_SANITIZER_MALLOC 1
#endif
#endif

namespace piper::runtime {
namespace {

#if defined(__GLIBC__) && !defined(PIPER_SANITIZER_MALLOC)
long minor_faults() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return r.ru_minflt;
}

// Allocates, writes and frees `bytes`, as a step's temporary; the page faults it took.
long faults_of_one_temporary(size_t bytes) {
  const long before = minor_faults();
  auto* p = static_cast<char*>(std::malloc(bytes));
  EXPECT_NE(p, nullptr);
  if (p == nullptr) return 0;
  std::memset(p, 1, bytes);
  EXPECT_EQ(static_cast<volatile char*>(p)[bytes / 2], 1);  // the writes stay
  std::free(p);
  return minor_faults() - before;
}

TEST(ProcessMemory, AFreedBlockIsReusedWithoutFaults) {
  // 64 MiB: above the largest mmap threshold glibc adapts to (32 MiB), so without the policy every such block is
  // mmap'ed, unmapped when freed and faulted in again: 16,384 faults of 4 KiB pages each time.
  const size_t bytes = size_t{64} << 20;
  const long pages = static_cast<long>(bytes / 4096);
  // Its premise: a fresh 64 MiB block faults in page by page. Not so with transparent huge pages always on (a
  // 2 MiB page per fault), or once the policy was applied in this process (gtest_repeat, a binary run whole).
  if (faults_of_one_temporary(bytes) <= pages / 2) {
    GTEST_SKIP() << "a fresh 64 MiB block took few page faults here (huge pages, or the policy already applied)";
  }
  ASSERT_TRUE(keep_freed_memory());
  faults_of_one_temporary(bytes);  // the heap grows once
  EXPECT_LT(faults_of_one_temporary(bytes), pages / 100);
  EXPECT_LT(faults_of_one_temporary(bytes), pages / 100);
}
#endif

}  // namespace
}  // namespace piper::runtime
