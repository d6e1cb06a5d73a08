// Tensor-parallel slices of the chunks the compiler shards over `tp` (ir shard pass: attn, mlp, shared, and under
// vocabulary parallelism embed and head), and the expert tensor-parallel slices of the experts (etp).
//
// Megatron's split, for tensor rank r of T:
//   attn    heads split: query heads [r*H/T, (r+1)*H/T) and their KV heads [r*K/T, (r+1)*K/T) (GQA groups stay
//           whole), i.e. the matching rows of w_qkv (column parallel) and columns of wo (row parallel)
//   mlp / shared  the intermediate units [r*F/T, (r+1)*F/T): rows of w_gate and w_up, columns of w_down
//   embed / head  the vocabulary rows [r*V/T, (r+1)*V/T) of the table and of w_out (VocabParallelEmbedding and the
//           column-parallel output layer); the head's norm weight is replicated. The embed slice writes zeros for
//           the ids it does not hold; the head slice gathers the cross-entropy statistics over tp
//           (StepContext::gather_over_vocab) and writes its part of the input gradient.
//   norm    replicated (every rank holds the whole weight)
// A slice chunk computes on the whole (all-gathered) input and writes this rank's partial output; the partial
// outputs of the T ranks sum (reduce-scatter or all-reduce over tp) to the single-rank chunk's output. The
// residual is added on tensor rank 0 only, so it is counted once in the sum, forward and backward.
// The slice's parameters are copied from the whole chunk drawn from the seed, so the T slices assemble into
// exactly the single-rank tensors. Parameter names are the whole chunk's ("L1.attn.w_qkv"); split parameters
// record their place in the whole tensor (Param::global_shape with global_offset, or global_blocks for w_qkv,
// whose Q, K and V rows are three separate row ranges of the whole), so checkpoints store them by position.
#pragma once

#include <memory>

#include "piper/base/status.h"
#include "piper/runtime/model/chunks/chunk.h"

namespace piper::runtime {

// The slice `rank` of `size` of `whole` (an attn, mlp, shared, embed or head chunk built with `dims`).
// InvalidArgument when `size` does not divide the heads, KV heads, the intermediate width or the vocabulary, or for
// another part.
Result<std::unique_ptr<Chunk>> make_tp_slice(const Chunk& whole, const ChunkDims& dims, int rank, int size,
                                             Allocator* allocator);

// Expert tensor parallelism (ir::MeshInfo::etp): the slice `rank` of `size` of an experts chunk `whole` (its local
// experts): every expert's intermediate units [r*F/S, (r+1)*F/S), i.e. those rows of w_gate and w_up (fc1, column
// parallel) and columns of w_down (fc2, row parallel). The slice computes a partial output for every row it is
// given; the etp reduce-scatter sums them (exec/executor_ep_etp.cc). The parameters keep the whole tensors' names
// and record their box in them (global_shape, global_offset), so checkpoints store them by position.
// InvalidArgument when `size` does not divide the expert intermediate width or `whole` is no experts chunk.
Result<std::unique_ptr<Chunk>> make_etp_slice(const Chunk& whole, const ChunkDims& dims, int rank, int size,
                                              Allocator* allocator);

// True for the parameters of a slice chunk that are split over tp (false: replicated, e.g. the norm weight).
bool tp_param_split(const Param& p);

}  // namespace piper::runtime
