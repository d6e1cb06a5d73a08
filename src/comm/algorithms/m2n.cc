#include "piper/comm/algorithms/m2n.h"

#include <algorithm>
#include <set>
#include <string>

namespace piper::comm {
namespace {
constexpr int kDispatchTag = 21;  // attention -> experts
constexpr int kCombineTag = 22;   // experts -> attention
}  // namespace

Result<M2nGroups> M2nGroups::create(int size, std::vector<int> attention, std::vector<int> experts) {
  if (attention.empty() || experts.empty()) {
    return invalid_argument("m2n: both the attention and the expert group need at least one rank");
  }
  std::set<int> seen;
  for (const auto* list : {&attention, &experts}) {
    for (int r : *list) {
      if (r < 0 || r >= size) {
        return invalid_argument("m2n: rank " + std::to_string(r) + " is outside the communicator [0, " +
                                std::to_string(size) + ")");
      }
      if (!seen.insert(r).second) {
        return invalid_argument("m2n: rank " + std::to_string(r) +
                                " appears twice; the attention and expert groups must be disjoint");
      }
    }
  }
  M2nGroups groups;
  groups.attention_ = std::move(attention);
  groups.experts_ = std::move(experts);
  return groups;
}

bool M2nGroups::is_attention(int rank) const {
  return std::find(attention_.begin(), attention_.end(), rank) != attention_.end();
}
bool M2nGroups::is_expert(int rank) const { return std::find(experts_.begin(), experts_.end(), rank) != experts_.end(); }

const std::vector<int>& M2nGroups::peers_of(int rank) const {
  if (is_attention(rank)) return experts_;
  if (is_expert(rank)) return attention_;
  return none_;
}

Status m2n_step(Communicator& comm, const M2nGroups& groups, const void* send, std::span<const size_t> send_bytes,
                void* recv, std::span<const size_t> recv_bytes, double timeout_s) {
  const int me = comm.rank();
  const std::vector<int>& peers = groups.peers_of(me);
  if (send_bytes.size() != peers.size() || recv_bytes.size() != peers.size()) {
    return invalid_argument("m2n: rank " + std::to_string(me) + " exchanges with " + std::to_string(peers.size()) +
                            " ranks of the other group but got " + std::to_string(send_bytes.size()) + " send and " +
                            std::to_string(recv_bytes.size()) + " receive counts");
  }
  const bool attention = groups.is_attention(me);
  const int send_tag = attention ? kDispatchTag : kCombineTag;
  const int recv_tag = attention ? kCombineTag : kDispatchTag;
  const auto* src = static_cast<const uint8_t*>(send);
  auto* dst = static_cast<uint8_t*>(recv);
  std::vector<Handle> handles;
  size_t offset = 0;
  for (size_t i = 0; i < peers.size(); ++i) {
    PIPER_ASSIGN_OR_RETURN(Handle h, comm.irecv(dst + offset, recv_bytes[i], peers[i], recv_tag));
    handles.push_back(std::move(h));
    offset += recv_bytes[i];
  }
  // Start with a different peer on every rank so that no receiver is hit by all senders at once.
  offset = 0;
  std::vector<size_t> offsets;
  for (size_t b : send_bytes) {
    offsets.push_back(offset);
    offset += b;
  }
  for (size_t k = 0; k < peers.size(); ++k) {
    size_t i = (k + static_cast<size_t>(me)) % peers.size();
    PIPER_ASSIGN_OR_RETURN(Handle h, comm.isend(src + offsets[i], send_bytes[i], peers[i], send_tag));
    handles.push_back(std::move(h));
  }
  return comm.wait_all(handles, timeout_s);
}

}  // namespace piper::comm
