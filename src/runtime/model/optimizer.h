// Optimizer: AdamW state for every trainable parameter of a Model, with global-norm gradient clipping.
//
// The moments m, v are allocated at construction (MemCategory::kOptimizer), zero; shard() shrinks a chunk's to
// the flat range a rank updates (ZeRO: the state exists only for the rank's shard). One optimizer step is
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

#include "piper/runtime/model/model.h"
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
  // Keeps the moments of `chunk` only for flat elements [begin, end) of its trainable parameters (one flat vector
  // in parameter order): a ZeRO shard. The rest is freed; call before the first update (state is zero then).
  void shard(const Chunk& chunk, int64_t begin, int64_t end);
  // AdamW on elements [begin, end) of the chunk's trainable parameters taken as one flat vector in parameter
  // order (a ZeRO shard; the moments must cover it). `grad` (optional): the shard's gradient, end - begin floats,
  // instead of the parameters' own gradients (ZeRO-2/3 accumulate it shard-sized). `values` (optional): per
  // trainable parameter, the tensor holding its elements inside [begin, end) (ZeRO-3: the parameters themselves
  // are sharded), instead of the parameters' own values.
  void update_range(Chunk& chunk, int64_t begin, int64_t end, const float* grad = nullptr,
                    std::vector<Tensor>* values = nullptr);

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }
  double clip_scale() const { return clip_scale_; }
  double learning_rate() const;  // of the current step
  // "<param>.m" and "<param>.v" for every trainable parameter, for checkpoints: the tensor holds the parameter's
  // flat elements [begin, end) (the whole parameter unless sharded; begin == end: none on this rank).
  struct StateTensor {
    std::string name;
    Tensor* tensor = nullptr;
    int64_t begin = 0, end = 0;
  };
  std::vector<StateTensor> state();

 private:
  struct Moments {
    Tensor m, v;
    int64_t begin = 0;  // flat element of the parameter that m[0], v[0] hold
    int64_t numel = 0;  // the parameter's elements
  };
  OptimizerSpec spec_;
  int64_t warmup_steps_;
  Allocator* allocator_;
  const Model& model_;
  std::map<const Param*, Moments> moments_;
  int64_t step_ = 0;
  double clip_scale_ = 1.0;
};

}  // namespace piper::runtime
