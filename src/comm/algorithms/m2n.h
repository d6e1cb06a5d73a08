// M2N: the unidirectional many-to-many exchange between two disjoint groups of one communicator, used when
// attention and experts are disaggregated (DisagMoE's AF-Pipe): the M attention ranks send token rows to the N
// expert ranks (dispatch) and the expert ranks send their outputs back (combine). No message ever travels
// between two ranks of the same group, and each (sender, receiver) pair carries at most one message per
// direction per step; zero-byte blocks post nothing.
//
// Dispatch and combine are fused into one step, as DisagMoE does: in m2n_step an attention rank sends the
// dispatch of microbatch i+1 while it receives the combine of microbatch i, and an expert rank sends the
// combine of microbatch i while it receives the dispatch of microbatch i+1, all posted at once. The bytes a
// rank receives equal those of a flat all-to-all-v in which only the other group sends to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "piper/base/status.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

class M2nGroups {
 public:
  // attention and experts: disjoint, non-empty lists of ranks of a communicator of `size` ranks.
  static Result<M2nGroups> create(int size, std::vector<int> attention, std::vector<int> experts);

  const std::vector<int>& attention() const { return attention_; }
  const std::vector<int>& experts() const { return experts_; }
  bool is_attention(int rank) const;
  bool is_expert(int rank) const;
  // The ranks this rank exchanges with (the other group); empty for a rank in neither group.
  const std::vector<int>& peers_of(int rank) const;

 private:
  std::vector<int> attention_, experts_;
  std::vector<int> none_;
};

// One fused step on `comm` (every rank of both groups calls it). send_bytes[i] bytes go to peers_of(me)[i]
// (blocks packed in that order), recv_bytes[i] bytes come from peers_of(me)[i]. Attention ranks send
// dispatch and receive combine; expert ranks send combine and receive dispatch. Blocking with a timeout whose
// error names the peers that did not deliver.
Status m2n_step(Communicator& comm, const M2nGroups& groups, const void* send, std::span<const size_t> send_bytes,
                void* recv, std::span<const size_t> recv_bytes, double timeout_s);

}  // namespace piper::comm
