// build_graph: the single-device training DAG of a (MoE) decoder-only transformer for one step.
//
// Chunks (tag part), in forward order:
//   embed (layer 0) -> per layer l: attn -> [MoE layer: router -> experts (+ shared)] [dense layer: mlp]
//   -> head (LM head + loss, layer L-1)
// each with an F task and a fused backward BW (reversed data edges; F -> BW carries the activations, the
// head's F -> BW the loss), plus one update node per (layer, part) holding parameters. Dispatch and combine
// are not in the single-device graph: `shard` with axis ep inserts them as all_to_all nodes.
// Annotations per microbatch: param_count and F flops come from the spec's counting (src/spec/counting.h): the
// chunks' parameters add up to count_params(model).total() (each norm sits with the chunk that applies it) and
// their F FLOPs to forward_flops_per_token(model, seq_len) x tokens; a BW costs 2 F. activation_bytes (with its
// tp-replicated part and a recomputed F's checkpoint) comes from src/spec/activation_counting.h, the closed
// form's own per-token terms, so the two agree on a stage's activations. The cost model's callback may
// overwrite all of them at lowering time.
#pragma once

#include "piper/base/status.h"
#include "piper/ir/graph.h"
#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"

namespace piper::ir {

// tokens per microbatch = train.micro_batch_size * train.seq_len. The mesh is copied into the graph; directives
// are checked against it. Errors on an inconsistent model (num_layers < 1, hidden_size < 1, ...).
// expert_load: the routed experts' rows over the mean rank's (> 0; compile::CompileOptions::expert_load): the
// experts chunk's activation bytes (its dispatched rows, intermediates and outputs) scale with it, its checkpoint
// (the router's output and routing, per token) does not.
// materialised_scores: the attention's backward recomputes its s x s probabilities (Piper's CPU runtime;
// cost::Calibration::attention_score_bytes > 0), part of its working set (Node::backward_scratch_bytes).
Result<Graph> build_graph(const ModelSpec& model, const TrainSpec& train, const MeshInfo& mesh,
                          double expert_load = 1.0, bool materialised_scores = false);

}  // namespace piper::ir
