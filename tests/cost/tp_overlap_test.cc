// cost/tp_overlap.h: the exposed time of a collective pipelined with a GEMM equals the makespan of the piece
// timeline it stands for (pieces of equal length; the collective's pieces back to back on their own stream,
// the GEMM's on the compute stream), minus the GEMM. The timeline is played out here piece by piece.
#include "piper/cost/tp_overlap.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace piper::cost {
namespace {

// Ring exchange: GEMM piece 0 needs nothing, GEMM piece i waits for comm piece i (n - 1 comm pieces).
double all_gather_timeline_exposed(double comm, double gemm, int n) {
  const double c = comm / (n - 1), g = gemm / n;
  double comm_end = 0, gemm_end = 0;
  for (int i = 0; i < n; ++i) {
    double ready = 0;
    if (i > 0) {
      comm_end += c;  // comm piece i
      ready = comm_end;
    }
    gemm_end = std::max(gemm_end, ready) + g;
  }
  return gemm_end - gemm;
}

// Pipeline: comm piece i starts when GEMM piece i ended (and the previous comm piece did).
double reduce_scatter_timeline_exposed(double comm, double gemm, int n) {
  const double c = comm / n, g = gemm / n;
  double comm_end = 0, gemm_end = 0;
  for (int i = 0; i < n; ++i) {
    gemm_end += g;
    comm_end = std::max(comm_end, gemm_end) + c;
  }
  return comm_end - gemm;
}

TEST(TpOverlapCostTest, ClosedFormsEqualThePieceTimelines) {
  for (int n : {2, 4, 8}) {
    for (double comm : {0.0, 0.1, 1.0, 3.0}) {
      for (double gemm : {0.05, 1.0, 2.5}) {
        EXPECT_NEAR(tp_overlap_all_gather_exposed_s(comm, gemm, n), all_gather_timeline_exposed(comm, gemm, n), 1e-12)
            << "n=" << n << " comm=" << comm << " gemm=" << gemm;
        EXPECT_NEAR(tp_overlap_reduce_scatter_exposed_s(comm, gemm, n), reduce_scatter_timeline_exposed(comm, gemm, n),
                    1e-12)
            << "n=" << n << " comm=" << comm << " gemm=" << gemm;
      }
    }
  }
  // A short all-gather hides entirely; a reduce-scatter always leaves its last piece.
  EXPECT_EQ(tp_overlap_all_gather_exposed_s(0.5, 1.0, 4), 0.0);
  EXPECT_DOUBLE_EQ(tp_overlap_reduce_scatter_exposed_s(0.4, 1.0, 4), 0.1);
}

}  // namespace
}  // namespace piper::cost
