// Heartbeats: every rank of a job tells every other rank "I am alive" a few times a second, from a thread of its
// own, so that a rank that stops (SIGSTOP, a node that freezes, a process stuck in the kernel) is named within a
// few seconds instead of after the communication timeout (PIPER_COMM_TIMEOUT_S, minutes).
//
// The beats come from a dedicated thread on a dedicated communicator (a dup of the world: its traffic never
// matches anyone else's), not from the threads that compute or communicate: a rank busy in a long GEMM, waiting
// for a slow peer or writing a checkpoint still beats; only a process that is not scheduled at all goes silent.
// A rank whose beats stop for more than `silence_s` is declared stopped: the verdict is process-wide and every
// communication wait (Communicator::wait, wait_all, the executor's and the HALO engine's polling loops) fails
// with peer_liveness()'s error at its next poll. Guards against false positives (docs/reliability.md, "Faults"):
// - a peer is judged only after its first beat has arrived (a slow start is left to the timeout);
// - a rank that stops its heartbeat cleanly sends a goodbye and is not judged after it;
// - when this rank's own heartbeat thread was not scheduled for silence_s / 2 (this process was stopped or
//   starved), it hears everyone afresh instead of judging peers by beats it could not receive.
// Configuration: PIPER_HEARTBEAT_S = silence_s (default 4 s, range [1, 3600], 0 = off); beats every
// min(0.25, silence_s / 16) s.
#pragma once

#include <memory>

#include "piper/base/status.h"

namespace piper::comm {

struct HeartbeatOptions {
  double silence_s = 4.0;  // a peer silent this long is declared stopped; 0 = no heartbeat
  double period_s = 0.25;  // seconds between two beats to each peer
};

// Reads PIPER_HEARTBEAT_S; InvalidArgument naming the value and the range when it is not a number in [1, 3600]
// or 0.
Result<HeartbeatOptions> heartbeat_options_from_env();

// A running heartbeat (Communicator::start_heartbeat); destroying it sends the goodbye and joins its thread.
class Heartbeat {
 public:
  virtual ~Heartbeat() = default;
};

// The process-wide verdict: OK while every judged peer beats, else Unavailable
// "rank R stopped responding (no heartbeat for X s; PIPER_HEARTBEAT_S=H s) ...". One atomic load when OK.
Status peer_liveness();

// For heartbeat implementations: declares world rank `rank` stopped (the first verdict stays), or clears it.
void report_silent_peer(int rank, double silent_s, double threshold_s);
void clear_silent_peer();

}  // namespace piper::comm
