// The NCCL backend on device memory, bootstrapped over MPI. Skips (with the reason) when Piper was built
// without NCCL, when no GPU is visible, or when there are fewer GPUs than ranks.
#include <gtest/gtest.h>

#include <algorithm>

#include "comm_test_util.h"
#include "piper/comm/algorithms/halo_all_to_all.h"
#include "piper/comm/algorithms/m2n.h"
#include "piper/comm/algorithms/pairwise_all_to_all.h"
#include "piper/comm/nccl/host_staged.h"
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

// M2N (attention ranks <-> expert ranks) uses only isend/irecv, so it runs on NCCL with device buffers.
TEST_F(NcclTest, M2nStepOnDeviceMemory) {
  const int n = nccl_->size(), me = nccl_->rank();
  if (n < 2) GTEST_SKIP() << "M2N needs an attention and an expert rank";
  auto groups = M2nGroups::create(n, {0}, [&] {
    std::vector<int> e;
    for (int r = 1; r < n; ++r) e.push_back(r);
    return e;
  }());
  ASSERT_TRUE(groups.ok()) << groups.status().to_string();
  const std::vector<int>& peers = groups->peers_of(me);
  const size_t per_peer = 1000;
  std::vector<uint8_t> send(per_peer * peers.size());
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<uint8_t>(me * 31 + i);
  void* d_send = device(send.size());
  void* d_recv = device(send.size());
  ASSERT_TRUE(copy_to_device(d_send, send.data(), send.size()).ok());
  const std::vector<size_t> bytes(peers.size(), per_peer);
  ASSERT_TRUE(m2n_step(*nccl_, *groups, d_send, bytes, d_recv, bytes, kTestTimeoutS).ok());
  std::vector<uint8_t> recv(send.size());
  ASSERT_TRUE(copy_to_host(recv.data(), d_recv, recv.size()).ok());
  for (size_t p = 0; p < peers.size(); ++p) {
    // The sender's block for this rank sits at this rank's index among the sender's peers.
    const std::vector<int>& theirs = groups->peers_of(peers[p]);
    const size_t idx = static_cast<size_t>(std::find(theirs.begin(), theirs.end(), me) - theirs.begin());
    ASSERT_LT(idx, theirs.size());
    for (size_t i = 0; i < per_peer; ++i) {
      ASSERT_EQ(recv[p * per_peer + i], static_cast<uint8_t>(peers[p] * 31 + idx * per_peer + i))
          << "from rank " << peers[p] << " byte " << i;
    }
  }
}

// HALO and the pairwise all-to-all pack on the host: on a device communicator they refuse with the reason.
TEST_F(NcclTest, HostPackingAlgorithmsRefuseDeviceMemory) {
  auto topo = NodeTopology::create(nccl_->size(), nccl_->size(), 1);
  ASSERT_TRUE(topo.ok());
  auto halo = HaloContext::create(*nccl_, *topo);
  ASSERT_FALSE(halo.ok());
  EXPECT_NE(halo.status().message().find("device"), std::string::npos) << halo.status().message();
  const std::vector<size_t> bytes(static_cast<size_t>(nccl_->size()), 0);
  const Status st = pairwise_all_to_all_v(*nccl_, nullptr, bytes, nullptr, bytes, kTestTimeoutS);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("device"), std::string::npos) << st.message();
}

// HALO and the pairwise all-to-all run over NCCL's transport on host buffers through host_staged().
TEST_F(NcclTest, HaloAndPairwiseOverHostStagedNccl) {
  auto dev = nccl_->dup("staged");
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  auto staged = host_staged(std::move(dev).value());
  ASSERT_TRUE(staged.ok()) << staged.status().to_string();
  Communicator& comm = **staged;
  EXPECT_EQ(comm.memory_kind(), MemoryKind::kHost);
  auto c = make_all_to_all_case(comm.rank(), comm.size(), zero_sizes, 0);
  std::vector<uint8_t> recv(c.expected.size(), 0);
  ASSERT_TRUE(pairwise_all_to_all_v(comm, c.send.data(), c.send_bytes, recv.data(), c.recv_bytes, kTestTimeoutS).ok());
  EXPECT_EQ(recv, c.expected);
  auto topo = NodeTopology::create(comm.size(), comm.size(), 1);
  ASSERT_TRUE(topo.ok());
  auto halo = HaloContext::create(comm, *topo);
  ASSERT_TRUE(halo.ok()) << halo.status().to_string();
  std::fill(recv.begin(), recv.end(), 0);
  const Status st = halo_all_to_all_v(**halo, c.send.data(), c.send_bytes, recv.data(), c.recv_bytes, kTestTimeoutS);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(recv, c.expected);
  // A collective through the staging: all-reduce of host floats.
  std::vector<float> in(100, static_cast<float>(comm.rank() + 1)), out(100, 0);
  auto h = comm.all_reduce_sum(in.data(), out.data(), in.size());
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(comm.wait(*h, kTestTimeoutS).ok());
  const int n = comm.size();
  for (float x : out) ASSERT_EQ(x, static_cast<float>(n * (n + 1) / 2));
}

// Runs everywhere: host_staged() takes only device communicators.
TEST(HostStaged, RefusesNullAndHostCommunicators) {
  EXPECT_FALSE(host_staged(nullptr).ok());
  auto host = world();
  ASSERT_NE(host, nullptr);
  auto staged = host_staged(std::move(host));
  ASSERT_FALSE(staged.ok());
  EXPECT_NE(staged.status().message().find("already a host-memory communicator"), std::string::npos)
      << staged.status().message();
}

}  // namespace
}  // namespace piper::comm::testing
