// The executor core's message table (internal to the executor, not a public header): the messages of one step
// between its tasks. A task publishes what it produced under its plan node, for the number of tasks that read
// it; each reader takes its own copy and the entry leaves with the last one. Forward messages are Activations,
// backward ones Gradients (two maps: a node has one of each at most).
//
// Thread-safe with a lock of its own, held only inside these calls and never while another is taken, so a caller
// may hold the executor's mutex around them.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include "piper/runtime/model/chunks/chunk.h"

namespace piper::runtime::detail {

class MessageTable {
 public:
  using Key = int32_t;  // the producing plan node (compile::Instruction::node)

  // `msg` for `consumers` readers; replaces what the node published before.
  template <typename Msg>
  void publish(Key node, Msg msg, int consumers) {
    std::lock_guard<std::mutex> lock(mu_);
    map<Msg>()[node] = Pending<Msg>{std::move(msg), consumers};
  }

  // One reader's copy of node `src`'s message; nullopt when it is not there (the reader runs before its producer,
  // or more readers take it than were published for). The entry is erased after its last reader.
  template <typename Msg>
  std::optional<Msg> take(Key src) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& m = map<Msg>();
    auto it = m.find(src);
    if (it == m.end()) return std::nullopt;
    Msg msg = it->second.msg;
    if (--it->second.remaining == 0) m.erase(it);
    return msg;
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    fwd_.clear();
    bwd_.clear();
  }

  // A node whose message was never taken by all its readers (forward ones first); nullopt when none is left.
  std::optional<Key> leftover() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fwd_.empty()) return fwd_.begin()->first;
    if (!bwd_.empty()) return bwd_.begin()->first;
    return std::nullopt;
  }

 private:
  template <typename Msg>
  struct Pending {
    Msg msg;
    int remaining = 0;
  };

  template <typename Msg>
  std::map<Key, Pending<Msg>>& map() {
    static_assert(std::is_same_v<Msg, Activation> || std::is_same_v<Msg, Gradient>);
    if constexpr (std::is_same_v<Msg, Activation>) {
      return fwd_;
    } else {
      return bwd_;
    }
  }

  mutable std::mutex mu_;
  std::map<Key, Pending<Activation>> fwd_;
  std::map<Key, Pending<Gradient>> bwd_;
};

}  // namespace piper::runtime::detail
