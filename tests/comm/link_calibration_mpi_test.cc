// measure_links (piper calibrate --ranks R) on a world whose size does not divide the all-to-all's bytes (R = 3:
// 512 KiB / 3 is no whole number of floats): every all-to-all it times moves whole bytes per peer from buffers of
// exactly that size (the sanitizer job runs this test; a float buffer rounded down read past its end before), and
// the figures come back complete with minimal iteration counts.
#include <gtest/gtest.h>

#include "comm_test_util.h"
#include "piper/comm/link_calibration.h"

namespace piper::comm::testing {
namespace {

LinkCalibrationOptions quick() {
  LinkCalibrationOptions o;
  o.p2p_bytes = {8, 4096};
  o.collective_bytes = {8, 4096};
  o.iterations = 1;
  o.warmup = 1;
  o.compute_s = 0.0005;
  o.sync_rounds = 1;
  o.sync_iterations = 2;
  o.contended_iterations = 2;
  o.contended_large_bytes = 64 * 1024;
  o.contended_large_iterations = 1;
  o.contended_alone_s = 0.01;
  o.contended_windows = 1;
  o.chain_task_s = {0.0005};
  o.chain_iterations = 3;
  return o;
}

TEST(LinkCalibrationMpi, AllToAllsMoveWholeBytesPerPeerOnAnyWorldSize) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  const LinkCalibrationOptions o = quick();
  auto c = measure_links(*w, o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const size_t p = static_cast<size_t>(w->size());
  const size_t moved = o.sync_all_to_all_bytes / p * p;  // whole bytes to each peer
  EXPECT_EQ(c->sync_all_to_all.bytes, moved);
  EXPECT_EQ(c->contended_all_to_all.bytes, moved);
  ASSERT_TRUE(c->exchange_chain.measured);
  EXPECT_EQ(c->exchange_chain.bytes, moved);
  ASSERT_EQ(c->exchange_chain.lag_s.size(), 1u);
  EXPECT_GE(c->exchange_chain.lag_s[0], 0.0);
  EXPECT_GE(c->exchange_chain.wait_cpu_s[0], 0.0);
}

}  // namespace
}  // namespace piper::comm::testing
