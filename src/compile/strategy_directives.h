// strategy_directives: a Strategy as the directive list it stands for, built only from public directives.
//
//   split(microbatches)
//   shard tp on attn/mlp/shared and, vocabulary-parallel, embed/head (tp > 1, sequence parallel when sp)
//   shard ep on experts (ep > 1, or etp > 1: the etp exchanges alone when ep = 1)
//   replicate {} with the strategy's ZeRO stage (dp > 1)                  recompute (full: every F; selective: attn)
//   disaggregate (af-pipe with disagg=1) or place layers -> stages (contiguous, balanced)
//   the schedule's place + order directives
// Writing this list to JSON and compiling it gives the same Plan as compiling the Strategy.
#pragma once

#include <vector>

#include "piper/base/status.h"
#include "piper/ir/directive.h"
#include "piper/ir/graph.h"
#include "piper/spec/model_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::compile {

// The mesh a strategy compiles to; vpp is the schedule's stages per rank (dualpipev 2).
// Disaggregation (disagg=1, schedule af-pipe): the strategy's pp attention pipeline ranks run on attn_ranks =
// dp*tp*pp ranks and f = ffn_ranks / (dp*tp) FFN pipeline ranks on ffn_ranks: every pipeline rank is run by dp*tp
// ranks, so ffn_ranks must be a multiple of dp*tp and ep divide dp (errors say so). The mesh has pp' = pp + f
// (attention ranks 0..pp-1, FFN ranks pp..pp+f-1) over 2 * num_layers stages: vpp = num_layers / pp when f = pp,
// else vpp = 2 num_layers / pp' when that divides, or MeshInfo::stages = 2 num_layers. f != pp is an uneven
// attention:FFN split (1:3 is pp=1 with ffn_ranks = 3 dp tp).
Result<ir::MeshInfo> strategy_mesh(const Strategy& s, const ModelSpec& model);

// The expert tensor parallelism the compiler lowers for `s` (MeshInfo::etp): s.etp, with ep > 1 or ep = 1 alike,
// except under disaggregation (af-pipe), whose FFN ranks keep whole experts, and on a model without routed experts
// (both 1).
int lowered_etp(const Strategy& s, const ModelSpec& model);

// The defaults are what Megatron does and what the closed form models; the CPU runtime runs them too
// (compile/target.h).
struct DirectiveOptions {
  // Shard the embedding and the head over tp (vocabulary parallelism, as Megatron and the CPU runtime run them);
  // false keeps them whole on every tp rank.
  bool vocab_parallel = true;
  // ZeRO-1/2: gather the updated parameters by the next step's forward (ReplicateDirective::param_gather
  // "before_forward", Megatron's --overlap-param-gather); false: right after the update ("after_update"). The
  // runtime executes both (docs/runtime.md, "ZeRO-1/2 parameter gathers").
  bool overlap_param_gather = true;
};
Result<std::vector<ir::Directive>> strategy_directives(const Strategy& s, const ModelSpec& model,
                                                       const DirectiveOptions& options = {});

// After the passes: every pipeline rank of the mesh holds some of the model's chunks. A directive file written
// for a smaller mesh (pp=2 compiled with --mesh pp=4) leaves ranks without work: refused, naming the mesh the
// directives fill (pipeline ranks and stages they place on) and the mesh given. (Ranks or stages past the mesh
// are refused by the place pass itself.)
Status check_directives_fill_mesh(const ir::Graph& graph);

}  // namespace piper::compile
