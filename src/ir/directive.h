// Directives: the public, JSON-serialisable API that turns the single-device training DAG into a distributed
// one. Each directive is one graph rewrite (a pass in src/ir/passes/); a list is applied in order.
//
// JSON: a file holds a list of directives, or {"directives": [...]}. Each directive is an object whose
// "directive" key names it; the rest are its fields:
//   {"directive": "split", "microbatches": 8}
//   {"directive": "place", "filter": {"layer": "0-7"}, "stage": 0}        tag nodes with a pipeline stage
//   {"directive": "place", "filter": {"stage": 7}, "rank": 0}             put a stage on a pipeline rank
//   {"directive": "replicate", "filter": {}, "zero": 3, "reduce": "reduce_scatter", "bucket_mb": 25}
//   {"directive": "shard", "filter": {"part": "experts"}, "axis": "ep", "algorithm": "halo"}
//   {"directive": "order", "rank": 0, "stream": "compute", "slots": ["0F0", ["0F7", "7BW3"], {"stage": 0, ...}]}
//   {"directive": "stream", "filter": {"pass": "W"}, "stream": "wgrad"}
//   {"directive": "recompute", "filter": {"part": "attn"}}
//   {"directive": "disaggregate", "attn_groups": 2, "ffn_groups": 2}            (optional: "attn_ports",
//                                                                             "ffn_ports", the NIC split)
// An order slot is one filter or a list of filters; a list means its members "may overlap" (no order among
// them). A filter may be written as an action string "<stage><pass><mb>" ("0F3", "7BW2", "5W0").
// Errors from parsing and applying name the directive: "directive 4 (order): ...".
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/ir/types.h"

namespace piper::ir {

struct SplitDirective {
  int microbatches = 1;
};

// Either tags matched nodes with a stage (stage >= 0), or places the matched nodes on a pipeline rank
// (rank >= 0), or both.
struct PlaceDirective {
  TagFilter filter;
  int stage = -1;
  int rank = -1;
};

// Data parallelism over `axis` ("dp"; expert chunks use "edp" automatically) for the matched chunks.
// zero 0: gradient `reduce` after the last microbatch's backward; 1: reduce_scatter + sharded optimizer update;
// 2: gradients reduce-scattered per microbatch and accumulated sharded; 3: also parameters sharded: all-gather
// before every use, re-shard after (per microbatch, so ZeRO-3 really holds only a shard between microbatches).
struct ReplicateDirective {
  TagFilter filter;
  std::string axis = "dp";
  int zero = 0;
  std::string reduce = "all_reduce";  // or "reduce_scatter" (implied by zero >= 1)
  double bucket_mb = 0;               // 0 = one bucket per chunk
  std::string stream = "dp";          // stream of the inserted collectives
  // zero 1/2: when the sharded update's parameters are gathered. "after_update": right after the update, in
  // the step that computed it. "before_forward": Megatron's --overlap-param-gather, by the next step's forward; in
  // the one-step plan the all-gather has no predecessor and feeds the group's first forward (its earliest
  // microbatch), so it runs beside the earlier layers' forwards (the closed form's model; what strategies emit for
  // every compile target). The runtime executes both as placed; under before_forward it completes the pending
  // gathers before a checkpoint, an expert migration and at the end of a run (Executor::complete_param_gathers).
  std::string param_gather = "after_update";
};

// Expert parallelism (axis "ep": all-to-all around the matched expert chunks) or Megatron tensor parallelism
// (axis "tp": column/row-parallel collectives, sequence parallel when sequence_parallel).
struct ShardDirective {
  TagFilter filter;
  std::string axis = "ep";
  std::string algorithm = "flat";  // ep: flat | halo; tp: ring
  bool sequence_parallel = false;
  std::string stream;  // "" = the default stream for the axis ("ep" / "tp")
};

struct OrderDirective {
  int rank = -1;  // pipeline rank the row belongs to; every matched node must be on it
  std::string stream = "compute";
  std::vector<std::vector<TagFilter>> slots;
};

struct StreamDirective {
  TagFilter filter;
  std::string stream;
};

// Without modules: the matched forward chunks drop their activations and re-run before their backward. With
// modules (Megatron's --recompute-modules names, '+' separated: "layernorm", "moe_act"), the matched chunks keep
// their activations less what those modules re-run: Node::norm_output_bytes and Node::act_output_bytes. Module
// recomputation counts unsharded bytes, so it must come before any shard directive.
struct RecomputeDirective {
  TagFilter filter;
  std::vector<std::string> modules;
};

// Attention chunks (attn, router, shared) on A-groups replicated over dp, expert chunks on F-groups sharded
// over ep; layer l goes to group l mod groups; dispatch + combine become one m2n exchange each way.
// attn_ports/ffn_ports: the NIC split between the groups (Strategy::attn_ports; 0: the NICs of the nodes each
// group occupies). The graph pass does not read them; they travel with the plan's strategy to the simulator.
struct DisaggregateDirective {
  int attn_groups = 1;
  int ffn_groups = 1;
  int attn_ports = 0;
  int ffn_ports = 0;
};

using DirectiveBody = std::variant<SplitDirective, PlaceDirective, ReplicateDirective, ShardDirective, OrderDirective,
                                   StreamDirective, RecomputeDirective, DisaggregateDirective>;

struct Directive {
  DirectiveBody body;
  const char* name() const;  // "split", "place", ...
  Json to_json() const;
  // `index` is the directive's position, used in messages.
  static Result<Directive> from_json(const Json& j, int index);
};

std::vector<std::string> directive_names();

Json directives_to_json(const std::vector<Directive>& directives);
Result<std::vector<Directive>> directives_from_json(const Json& j, const std::string& what);
Result<std::vector<Directive>> load_directives_file(const std::string& path);

// "directive 3 (order)"
std::string directive_label(const Directive& d, int index);

// Parses "<stage><pass><mb>" ("0F3", "7BW2"); stage may be omitted ("F3") when `default_stage` >= 0.
Result<TagFilter> parse_action_filter(const std::string& text, int default_stage, const std::string& what);
// The inverse for filters with exactly one stage, one mb and a pass: "0F3". Others print as JSON.
std::string action_text(const TagFilter& f, bool with_stage);

}  // namespace piper::ir
