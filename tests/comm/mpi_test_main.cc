// main() of the multi-rank GoogleTest binaries (run by CTest under mpiexec -n {2,4,8}). Every rank runs every
// test in the same order; rank 0 prints the usual output, other ranks print only their failures; the exit code
// is non-zero on every rank when any rank failed.
#include <gtest/gtest.h>

#include <cstdio>

#include "comm_test_util.h"
#include "piper/base/check.h"
#include "piper/comm/mpi/mpi_communicator.h"

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", piper::process_rank(),
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.summary());
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  PIPER_CHECK_OK(piper::comm::mpi_init(&argc, &argv));
  if (piper::process_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter);
  }
  int rc = RUN_ALL_TESTS();
  float failed = rc != 0 ? 1.0f : 0.0f;
  {
    auto world = piper::comm::mpi_world();
    PIPER_CHECK_OK(world.status());
    auto h = (*world)->all_reduce_sum(&failed, &failed, 1);
    PIPER_CHECK_OK(h.status());
    PIPER_CHECK_OK((*world)->wait(*h, 60.0));
  }
  PIPER_CHECK_OK(piper::comm::mpi_finalize());
  return failed > 0 ? 1 : 0;
}
