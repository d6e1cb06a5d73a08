// The NCCL backend on device memory, bootstrapped over MPI. Skips (with the reason) when Piper was built
// without NCCL, when no GPU is visible, or when there are fewer GPUs than ranks.
#include <gtest/gtest.h>

#include "comm_test_util.h"
#include "piper/comm/nccl/nccl_communicator.h"

namespace piper::comm::testing {
namespace {

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = world();
    ASSERT_NE(host_, nullptr);
    if (!nccl_compiled_in()) GTEST_SKIP() << "built without the CUDA toolkit / NCCL";
    auto devices = cuda_device_count();
    if (!devices.ok()) GTEST_SKIP() << "no GPU: " << devices.status().message();
    if (*devices < host_->size()) {
      GTEST_SKIP() << host_->size() << " ranks but only " << *devices << " GPU(s); NCCL needs one GPU per rank";
    }
    auto nccl = nccl_create(*host_);
    ASSERT_TRUE(nccl.ok()) << nccl.status().to_string();
    nccl_ = std::move(nccl).value();
  }
  void TearDown() override {
    for (void* p : buffers_) EXPECT_TRUE(device_free(p).ok());
  }
  void* device(size_t bytes) {
    auto p = device_alloc(bytes);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    buffers_.push_back(*p);
    return *p;
  }
  std::unique_ptr<Communicator> host_, nccl_;
  std::vector<void*> buffers_;
};

TEST_F(NcclTest, AllReduceSum) {
  const int n = nccl_->size(), me = nccl_->rank();
  const size_t count = 4097;
  std::vector<float> in(count), out(count, -1);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(me * 1000 + i);
  auto* d_in = static_cast<float*>(device(count * 4));
  auto* d_out = static_cast<float*>(device(count * 4));
  ASSERT_TRUE(copy_to_device(d_in, in.data(), count * 4).ok());
  auto h = nccl_->all_reduce_sum(d_in, d_out, count);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(nccl_->wait(*h, kTestTimeoutS).ok());
  ASSERT_TRUE(copy_to_host(out.data(), d_out, count * 4).ok());
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], static_cast<float>(1000 * n * (n - 1) / 2 + n * i));
}

size_t zero_sizes(int src, int dst, int n, uint64_t) { return (dst == n - 1 || src == 0) ? 0 : 1000 * (src + dst) + 3; }

TEST_F(NcclTest, AllToAllVWithZeroSizesEqualsPattern) {
  auto c = make_all_to_all_case(nccl_->rank(), nccl_->size(), zero_sizes, 0);
  void* d_send = device(c.send.size());
  void* d_recv = device(c.expected.size());
  if (!c.send.empty()) {
    ASSERT_TRUE(copy_to_device(d_send, c.send.data(), c.send.size()).ok());
  }
  auto h = nccl_->all_to_all_v(d_send, c.send_bytes, d_recv, c.recv_bytes);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(nccl_->wait(*h, kTestTimeoutS).ok());
  std::vector<uint8_t> recv(c.expected.size());
  if (!recv.empty()) {
    ASSERT_TRUE(copy_to_host(recv.data(), d_recv, recv.size()).ok());
  }
  EXPECT_EQ(recv, c.expected);
}

TEST_F(NcclTest, AllGatherAndReduceScatter) {
  const int n = nccl_->size(), me = nccl_->rank();
  const size_t per_rank = 64;
  std::vector<float> in(per_rank * n);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(me + i);
  auto* d_in = static_cast<float*>(device(in.size() * 4));
  auto* d_out = static_cast<float*>(device(per_rank * 4));
  ASSERT_TRUE(copy_to_device(d_in, in.data(), in.size() * 4).ok());
  auto rs = nccl_->reduce_scatter_sum(d_in, d_out, per_rank);
  ASSERT_TRUE(rs.ok());
  ASSERT_TRUE(nccl_->wait(*rs, kTestTimeoutS).ok());
  auto* d_all = static_cast<float*>(device(in.size() * 4));
  auto ag = nccl_->all_gather(d_out, d_all, per_rank * 4);
  ASSERT_TRUE(ag.ok());
  ASSERT_TRUE(nccl_->wait(*ag, kTestTimeoutS).ok());
  std::vector<float> all(in.size());
  ASSERT_TRUE(copy_to_host(all.data(), d_all, all.size() * 4).ok());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], static_cast<float>(n * (n - 1) / 2 + n * i));
}

}  // namespace
}  // namespace piper::comm::testing
