// Separate communicators per traffic kind, so that pipeline sends cannot deadlock against collectives and a
// rank's sends cannot be matched against its own receives' traffic.
//
// P2pChannels holds two duplicates of a group: "up" carries every message from a lower to a higher rank,
// "down" every message from a higher to a lower rank. A pipeline stage therefore sends activations on one
// communicator and receives gradients on the other (Piper's separate send/recv communicators), and neither
// shares a matching context with any collective. Collectives of different purposes (dp gradients, ep
// dispatch, ep combine) each get their own duplicate through purpose_communicator().
#pragma once

#include <memory>
#include <string>

#include "piper/base/status.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

class P2pChannels {
 public:
  // Collective over `group`.
  static Result<P2pChannels> create(Communicator& group);

  // The communicator a message to / from `peer` travels on.
  Communicator& send_comm(int peer) { return peer >= up_->rank() ? *up_ : *down_; }
  Communicator& recv_comm(int peer) { return peer <= up_->rank() ? *up_ : *down_; }

  Result<Handle> isend(const void* data, size_t bytes, int peer, int tag) {
    return send_comm(peer).isend(data, bytes, peer, tag);
  }
  Result<Handle> irecv(void* data, size_t bytes, int peer, int tag) {
    return recv_comm(peer).irecv(data, bytes, peer, tag);
  }
  Status wait(Handle& handle, double timeout_s) { return up_->wait(handle, timeout_s); }

 private:
  std::unique_ptr<Communicator> up_;
  std::unique_ptr<Communicator> down_;
};

// Collective over `group`: a duplicate named "<group>/<purpose>" for one kind of collective traffic.
Result<std::unique_ptr<Communicator>> purpose_communicator(Communicator& group, const std::string& purpose);

}  // namespace piper::comm
