// The migration planner's cost model (MigrationCost, planner.h) built from the model, the training dtypes and the
// cluster: one formula for the trainer's live migration and for `piper simulate --expert-zipf`.
#pragma once

#include "piper/balance/planner.h"
#include "piper/spec/cluster_spec.h"
#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"

namespace piper::balance {

// Bytes that travel with one expert when it moves: its weights, gradients and both optimizer moments, plus the
// optimizer's master copy when it keeps one (master_dtype != param_dtype), in the training dtypes. Experts sliced
// over etp ranks move one slice per rank.
double expert_migration_bytes(const ModelSpec& model, const TrainSpec& train, int etp);

// Experts move at expert_migration_bytes over the device-to-device link inside a node (EP groups stay inside a
// node), paying its latency once. `time_per_token_s` is what a routed token costs the busiest rank (the caller's
// estimate: the trainer's from FLOPs, the simulator's from simulated steps); `steps_next_window` is how many steps
// the new placement serves before the next plan.
MigrationCost migration_cost(const ModelSpec& model, const TrainSpec& train, const ClusterSpec& cluster, int etp,
                             double steps_next_window, double time_per_token_s);

}  // namespace piper::balance
