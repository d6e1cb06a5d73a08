#include "piper/comm/channels.h"

namespace piper::comm {

Result<P2pChannels> P2pChannels::create(Communicator& group) {
  P2pChannels channels;
  PIPER_ASSIGN_OR_RETURN(channels.up_, group.dup(group.name() + "/p2p-up"));
  PIPER_ASSIGN_OR_RETURN(channels.down_, group.dup(group.name() + "/p2p-down"));
  return channels;
}

Result<std::unique_ptr<Communicator>> purpose_communicator(Communicator& group, const std::string& purpose) {
  if (purpose.empty()) return invalid_argument("comm: purpose_communicator needs a non-empty purpose name");
  return group.dup(group.name() + "/" + purpose);
}

}  // namespace piper::comm
