// Optimizer: AdamW state for every trainable parameter of a Model, with global-norm gradient clipping.
//
// The moments m, v are allocated at construction (MemCategory::kOptimizer), zero. One optimizer step is
//   begin_step()   once, after every gradient of the step is final: computes the global norm over all
//                  trainable gradients in model order (deterministic) and the clipping scale; step() += 1
//   update(chunk)  for each chunk (in any order): AdamW on its parameters with that scale
// The learning rate follows a linear warm-up over `warmup_steps` steps (0 = constant).
// Thread-safety: begin_step must not race with update; updates of different chunks may run concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "piper/runtime/model.h"
#include "piper/spec/train_spec.h"

namespace piper::runtime {

class Optimizer {
 public:
  Optimizer(const OptimizerSpec& spec, int64_t warmup_steps, const Model& model, Allocator* allocator);

  // Returns the gradient norm before clipping.
  double begin_step();
  // The same with a norm computed elsewhere (multi-rank runs: the norm over every rank's gradients).
  void begin_step_with_norm(double global_norm);
  // Sum of squares of `chunk`'s trainable gradients (double, fixed order): a rank's part of the global norm.
  static double grad_sq(const Chunk& chunk);
  // The same over flat elements [begin, end) (a ZeRO shard).
  static double grad_sq_range(const Chunk& chunk, int64_t begin, int64_t end);
  void update(Chunk& chunk);
  // AdamW on elements [begin, end) of the chunk's trainable parameters taken as one flat vector in parameter
  // order (a ZeRO shard). The moments are still allocated whole.
  void update_range(Chunk& chunk, int64_t begin, int64_t end);

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }
  double clip_scale() const { return clip_scale_; }
  double learning_rate() const;  // of the current step
  // "<param>.m" and "<param>.v" for every trainable parameter, for checkpoints.
  std::vector<std::pair<std::string, Tensor*>> state();

 private:
  struct Moments {
    Tensor m, v;
  };
  OptimizerSpec spec_;
  int64_t warmup_steps_;
  const Model& model_;
  std::map<const Param*, Moments> moments_;
  int64_t step_ = 0;
  double clip_scale_ = 1.0;
};

}  // namespace piper::runtime
