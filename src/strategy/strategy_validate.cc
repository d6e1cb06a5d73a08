// Strategy::validate and validate_for: every rule names itself and a fix.
#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/strings.h"
#include "piper/spec/activation_counting.h"
#include "piper/spec/limits.h"
#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"
#include "piper/strategy/strategy.h"

namespace piper {
namespace {

Status fail(const std::string& message) { return invalid_argument("strategy: " + message); }

// Values d in 1..n that divide n and also divide `also` (0 = no second constraint), as "{1,2,4,8}".
std::string divisors_text(int64_t n, int64_t also = 0) {
  std::vector<std::string> out;
  for (int64_t d = 1; d <= n && out.size() < 24; ++d) {
    if (n % d == 0 && (also == 0 || also % d == 0)) out.push_back(std::to_string(d));
  }
  return "{" + join(out, ",") + "}";
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

// Upper bounds (spec/limits.h) on the sizes that schedules, plans and simulations allocate per unit.
Status validate_sizes(const Strategy& s) {
  struct Bound {
    const char* name;
    int value;
    int64_t max;
    const char* why;
  };
  const Bound bounds[] = {{"dp", s.dp, kMaxWorldSize, "ranks in the world"},
                          {"tp", s.tp, kMaxWorldSize, "ranks in the world"},
                          {"pp", s.pp, kMaxWorldSize, "ranks in the world"},
                          {"ep", s.ep, kMaxWorldSize, "ranks in the world"},
                          {"etp", s.etp, kMaxWorldSize, "ranks in the world"},
                          {"attn_ranks", s.attn_ranks, kMaxWorldSize, "ranks in the world"},
                          {"ffn_ranks", s.ffn_ranks, kMaxWorldSize, "ranks in the world"},
                          {"attn_ports", s.attn_ports, kMaxWorldSize, "NICs in the cluster"},
                          {"ffn_ports", s.ffn_ports, kMaxWorldSize, "NICs in the cluster"},
                          {"vpp", s.vpp, kMaxVpp, "virtual stages per pipeline rank; published runs use <= 8"},
                          {"microbatches", s.microbatches, kMaxMicrobatches, "per step; published runs use <= 512"},
                          {"mbs", s.mbs, kMaxMicroBatchSize, "sequences per microbatch"}};
  for (const auto& b : bounds) {
    if (b.value > b.max) {
      return fail(std::string(b.name) + "=" + std::to_string(b.value) + " is out of range; allowed 1.." +
                  std::to_string(b.max) + " (" + b.why + ")");
    }
  }
  const int64_t world = static_cast<int64_t>(s.dp) * s.tp * s.pp;
  if (world > kMaxWorldSize) {
    return fail("dp*tp*pp = " + std::to_string(world) + " ranks is out of range; allowed <= " +
                std::to_string(kMaxWorldSize) + " (per-rank programs are built for every rank); lower dp, tp or pp");
  }
  // Every pipeline action (a forward or a backward of one microbatch on one stage) is a schedule entry, a program
  // step per rank and a simulator event: ~0.5 KiB each, measured on the compiled plans.
  const int64_t actions = static_cast<int64_t>(s.microbatches) * s.pp * s.chunks_per_rank();
  if (actions > kMaxPipelineActions) {
    return fail("microbatches*pp*chunks = " + std::to_string(s.microbatches) + "*" + std::to_string(s.pp) + "*" +
                std::to_string(s.chunks_per_rank()) + " = " + std::to_string(actions) +
                " pipeline actions is out of range; allowed <= " + std::to_string(kMaxPipelineActions) +
                " (the schedule and plan would hold " + std::to_string(2 * actions) + " forward/backward actions, " +
                gib(2.0 * static_cast<double>(actions) * 512) + " or more); lower microbatches or pp");
  }
  return ok_status();
}

}  // namespace

Status Strategy::validate() const {
  struct Degree {
    const char* name;
    int value;
  };
  const Degree degrees[] = {
      {"dp", dp},  {"tp", tp}, {"pp", pp}, {"vpp", vpp}, {"ep", ep}, {"etp", etp}, {"microbatches", microbatches},
      {"mbs", mbs}};
  for (const auto& d : degrees) {
    if (d.value < 1) return fail(std::string(d.name) + "=" + std::to_string(d.value) + " must be >= 1");
  }
  if (attn_ranks < 0 || ffn_ranks < 0) return fail("attn_ranks and ffn_ranks must be >= 0");
  if (attn_ports < 0 || ffn_ports < 0) return fail("attn_ports and ffn_ports must be >= 0");
  PIPER_RETURN_IF_ERROR(validate_sizes(*this));
  if (zero < 0 || zero > 3) return fail("zero=" + std::to_string(zero) + " must be one of {0,1,2,3}");
  // The products below are ints everywhere (world_size(), num_stages(), ...): refuse degrees they overflow.
  const struct {
    const char* name;
    int64_t value;
  } products[] = {{"dp*tp*pp", int64_t{dp} * tp * pp},
                  {"pp*vpp", int64_t{pp} * vpp},
                  {"pp*ep", int64_t{pp} * ep},
                  {"attn_ranks+ffn_ranks", int64_t{attn_ranks} + ffn_ranks}};
  for (const auto& p : products) {
    if (p.value > INT32_MAX) {
      return fail(std::string(p.name) + " = " + std::to_string(p.value) + " overflows an int (at most " +
                  std::to_string(INT32_MAX) + "); pick smaller degrees");
    }
  }
  PIPER_RETURN_IF_ERROR(parse_schedule(schedule).status());
  if (a2a != "flat" && a2a != "halo") return fail("a2a=" + a2a + " is not one of {flat, halo}");
  if (!recompute_modules.empty() && recompute == Recompute::kFull) {
    return fail("recompute_modules=" + join(recompute_modules, "+") +
                " with recompute=full: full recomputation already drops every chunk's activations; drop one");
  }
  for (size_t i = 0; i < recompute_modules.size(); ++i) {
    const std::string& m = recompute_modules[i];
    if (!is_recompute_module(m) || (i > 0 && recompute_modules[i - 1] >= m)) {
      return fail("recompute_modules must be a sorted set of {layernorm, moe_act}, got " +
                  join(recompute_modules, "+"));
    }
  }
  // Disaggregated experts live on the FFN ranks (checked below against ffn_ranks), not inside the DP group.
  if (fold) {
    if (disaggregate)
      return fail("fold=1 lays experts over the tp*dp ranks; with disagg=1 they live on the FFN ranks: drop one");
    if (etp != 1) {
      return fail("fold=1 with etp=" + std::to_string(etp) +
                  " is not built (folding here keeps whole experts on "
                  "every rank, Megatron's --expert-tensor-parallel-size 1); set etp=1");
    }
    if (folded_layout(order) != folded_layout(Strategy{}.order)) {
      return fail("fold=1 lays the ranks out tp, then dp, then pp, with the expert mesh folded over tp*dp; order=" +
                  join(order, "-") + " is not built with it: drop order=");
    }
    if ((dp * tp) % ep != 0) {
      return fail("fold=1: ep=" + std::to_string(ep) + " does not divide tp*dp=" + std::to_string(dp * tp) +
                  " (the expert groups tile the stage's tp*dp ranks); pick ep in " + divisors_text(dp * tp));
    }
  } else if (!disaggregate && dp % ep != 0) {
    return fail(
        "ep=" + std::to_string(ep) + " does not divide dp=" + std::to_string(dp) +
        " (experts are sharded inside the data-parallel group); pick ep in " + divisors_text(dp) +
        ((dp * tp) % ep == 0 && tp > 1 ? ", or set fold=1 (Megatron's MoE parallel folding: ep over tp*dp)" : ""));
  }
  if (tp % etp != 0) {
    return fail("etp=" + std::to_string(etp) + " does not divide tp=" + std::to_string(tp) + "; pick etp in " +
                divisors_text(tp));
  }
  if (disaggregate && etp != 1) {
    // The compiler keeps the FFN ranks' experts whole (compile::lowered_etp); pricing or running etp there would
    // describe a plan nobody executes.
    return fail("etp=" + std::to_string(etp) + " with disagg=1: af-pipe's FFN ranks hold whole experts (sharded over "
                "ep, not sliced over etp); set etp=1");
  }
  if (sp && tp == 1) return fail("sp=1 needs tp >= 2 (sequence parallel splits TP-replicated activations); set sp=0");
  if (tp_overlap && (tp == 1 || !sp)) {
    return fail(
        "tp_overlap=1 overlaps the sequence-parallel all-gathers and reduce-scatters with the tp GEMMs, so it "
        "needs tp >= 2 and sp=1 (as Megatron's --tp-comm-overlap does; got tp=" +
        std::to_string(tp) + ", sp=" + (sp ? "1" : "0") + "); set sp=1 or drop tp_overlap");
  }
  // Mesh order: a permutation of the four axes.
  static const std::vector<std::string> kAxes = {"tp", "ep", "dp", "pp"};
  if (order.size() != kAxes.size()) {
    return fail("order=" + join(order, "-") +
                " must list each of tp, ep, dp, pp once, innermost first (e.g. tp-ep-dp-pp)");
  }
  for (const auto& axis : kAxes) {
    int count = 0;
    for (const auto& o : order) count += o == axis ? 1 : 0;
    if (count != 1) {
      return fail("order=" + join(order, "-") + " must list each of tp, ep, dp, pp once (axis '" + axis + "' appears " +
                  std::to_string(count) + " times); e.g. order=tp-ep-dp-pp");
    }
  }
  ScheduleKind kind = schedule_kind();
  if (kind == ScheduleKind::kInterleaved) {
    if (vpp < 2) return fail("schedule=interleaved needs vpp >= 2 (vpp=1 is plain 1f1b); set vpp=2 or schedule=1f1b");
    if (microbatches % pp != 0) {
      return fail("schedule=interleaved needs microbatches divisible by pp=" + std::to_string(pp) + " (got " +
                  std::to_string(microbatches) +
                  "); use microbatches=" + std::to_string((microbatches + pp - 1) / pp * pp));
    }
  } else if (vpp != 1 && kind != ScheduleKind::kCustom) {
    return fail("vpp=" + std::to_string(vpp) + " needs schedule=interleaved (schedule=" + schedule + " places " +
                (kind == ScheduleKind::kDualPipeV ? "2 chunks" : "1 chunk") +
                " per rank by itself); set vpp=1 or schedule=interleaved");
  }
  if ((kind == ScheduleKind::k1F1B || kind == ScheduleKind::kInterleaved || kind == ScheduleKind::kZBH1) &&
      microbatches < pp) {
    return fail("schedule=" + schedule + " needs microbatches >= pp=" + std::to_string(pp) + " (got " +
                std::to_string(microbatches) +
                ") so every stage reaches steady state; raise microbatches or use gpipe");
  }
  if (kind == ScheduleKind::kDualPipeV && microbatches < 2 * pp) {
    return fail("dualpipev needs microbatches >= 2*pp = " + std::to_string(2 * pp) + " (got " +
                std::to_string(microbatches) + "); raise microbatches or use 1f1b");
  }
  if (ep_overlap && ep < 2) {
    return fail(
        "ep_overlap=1 hides the expert-parallel all-to-alls behind another microbatch's compute, so it needs "
        "ep >= 2 (got ep=" +
        std::to_string(ep) + "); set ep or drop ep_overlap");
  }
  if (ep_overlap && kind != ScheduleKind::k1F1B && kind != ScheduleKind::kInterleaved) {
    return fail(
        "ep_overlap=1 pairs the steady-state forward and backward of 1f1b or interleaved (Megatron's combined "
        "1F1B); schedule=" +
        schedule +
        (kind == ScheduleKind::kDualPipeV || kind == ScheduleKind::kAFPipe ? " pairs them by itself"
                                                                           : " has no such pairs") +
        "; drop ep_overlap or use schedule=interleaved");
  }
  if (ep_overlap && kind == ScheduleKind::k1F1B && pp > 1) {
    // A pair's forward input arrives from the previous stage while the pair runs: under plain 1F1B it arrives late
    // and holds the pair's backward chunks behind it (simulated: a slower step than without the overlap).
    // Megatron-LM refuses it too ("virtual_pipeline_model_parallel_size must be specified when
    // pipeline_model_parallel_size > 1", transformer_config.py).
    return fail("ep_overlap=1 with pp=" + std::to_string(pp) +
                " needs schedule=interleaved (under plain 1f1b a pair waits for its forward's input from the previous "
                "stage, as in Megatron, which refuses it too); use schedule=interleaved with vpp >= 2, or pp=1");
  }
  if ((kind == ScheduleKind::kAFPipe) != disaggregate) {
    return fail(disaggregate ? "disagg=1 needs schedule=af-pipe (the only schedule for disaggregated attention/FFN)"
                             : "schedule=af-pipe needs disagg=1 with attn_ranks and ffn_ranks set");
  }
  if (!disaggregate && (attn_ranks != 0 || ffn_ranks != 0)) {
    // Without disagg=1 they would be ignored, and the compact form (to_string) drops them.
    return fail("attn_ranks=" + std::to_string(attn_ranks) + ", ffn_ranks=" + std::to_string(ffn_ranks) +
                " take effect only with disagg=1,schedule=af-pipe; add those or drop attn_ranks and ffn_ranks");
  }
  if (!disaggregate && (attn_ports != 0 || ffn_ports != 0)) {
    return fail("attn_ports=" + std::to_string(attn_ports) + ", ffn_ports=" + std::to_string(ffn_ports) +
                " split the NICs between af-pipe's attention and FFN groups; add disagg=1,schedule=af-pipe or drop "
                "attn_ports and ffn_ports");
  }
  if ((attn_ports == 0) != (ffn_ports == 0)) {
    return fail("attn_ports=" + std::to_string(attn_ports) + ", ffn_ports=" + std::to_string(ffn_ports) +
                ": set both (the NIC split between the attention and FFN groups) or neither (each group uses the "
                "NICs of the nodes it occupies)");
  }
  if (disaggregate) {
    if (attn_ranks < 1 || ffn_ranks < 1) {
      return fail("disagg=1 needs attn_ranks >= 1 and ffn_ranks >= 1 (got " + std::to_string(attn_ranks) + ", " +
                  std::to_string(ffn_ranks) + ")");
    }
    if (attn_ranks != dp * tp * pp) {
      return fail("attn_ranks=" + std::to_string(attn_ranks) + " != dp*tp*pp = " + std::to_string(dp * tp * pp) +
                  " (attention runs data-parallel over dp on the attention group); set attn_ranks=" +
                  std::to_string(dp * tp * pp));
    }
    if (ffn_ranks % ep != 0) {
      return fail("ffn_ranks=" + std::to_string(ffn_ranks) + " is not a multiple of ep = " + std::to_string(ep) +
                  " (each FFN pipeline rank shards its experts over ep ranks)");
    }
  }
  return ok_status();
}

Status Strategy::validate_for(const ModelSpec& model, const TrainSpec& train, int world) const {
  PIPER_RETURN_IF_ERROR(validate());
  if (world != world_size()) {
    std::string msg = "world " + std::to_string(world) +
                      " != " + (disaggregate ? "attn_ranks+ffn_ranks = " : "dp*tp*pp = ") +
                      std::to_string(world_size());
    if (!disaggregate && world % (tp * pp) == 0)
      msg += "; set dp=" + std::to_string(world / (tp * pp));
    else if (!disaggregate)
      msg += "; pick tp*pp dividing " + std::to_string(world);
    return fail(msg);
  }
  if (!model.is_moe() && !recompute_modules.empty()) {
    return fail("recompute_modules=" + join(recompute_modules, "+") + " acts on MoE layers only and model " +
                model.name + " has none (its norms are fused into the next linear); drop recompute_modules");
  }
  if (!model.is_moe() && ep != 1) {
    return fail("ep=" + std::to_string(ep) + " but model " + model.name + " has no routed experts; set ep=1");
  }
  if (model.is_moe() && model.moe.num_experts % ep != 0) {
    return fail("ep=" + std::to_string(ep) + " does not divide num_experts=" + std::to_string(model.moe.num_experts) +
                "; pick ep in " + divisors_text(model.moe.num_experts, dp));
  }
  if (model.is_moe() && tp > 1 && !sp) {
    return fail("MoE with tp=" + std::to_string(tp) +
                " needs sp=1 (tokens are split over the TP ranks before dispatch, as Megatron requires); set sp=1");
  }
  if (model.num_heads % tp != 0) {
    return fail("tp=" + std::to_string(tp) + " does not divide num_heads=" + std::to_string(model.num_heads) +
                "; pick tp in " + divisors_text(model.num_heads));
  }
  if (model.attention == AttentionType::kStandard && model.num_kv_heads > 0 && model.num_kv_heads % tp != 0) {
    return fail("tp=" + std::to_string(tp) + " does not divide num_kv_heads=" + std::to_string(model.num_kv_heads) +
                "; pick tp in " + divisors_text(model.num_kv_heads));
  }
  if (sp && tp > 1 && (train.micro_batch_size * train.seq_len) % tp != 0) {
    return fail("sp=1 splits each microbatch's mbs*seq = " + std::to_string(train.micro_batch_size * train.seq_len) +
                " tokens over tp=" + std::to_string(tp) + " ranks, and " + std::to_string(tp) +
                " does not divide it; make mbs*seq a multiple of tp (e.g. seq " +
                std::to_string((train.seq_len + tp - 1) / tp * tp) + ")");
  }
  if (num_stages() > model.num_layers) {
    std::string what = chunks_per_rank() == 1 ? "pp" : schedule == "dualpipev" ? "pp*2 (dualpipev)" : "pp*vpp";
    return fail(what + "=" + std::to_string(num_stages()) + " > num_layers=" + std::to_string(model.num_layers) +
                " (every stage needs a layer); lower pp" + (chunks_per_rank() > 1 ? " or vpp" : ""));
  }
  if (train.micro_batch_size != mbs) {
    return fail("mbs=" + std::to_string(mbs) + " != train micro_batch_size=" + std::to_string(train.micro_batch_size) +
                "; make them equal");
  }
  int64_t product = global_batch();
  if (train.global_batch > 0 && product != train.global_batch) {
    std::string msg =
        "microbatches*mbs*dp = " + std::to_string(product) + " != global batch " + std::to_string(train.global_batch);
    int64_t per_mb = static_cast<int64_t>(dp) * mbs;
    if (train.global_batch % per_mb == 0) {
      msg += "; set microbatches=" + std::to_string(train.global_batch / per_mb);
    } else {
      msg += "; the global batch must be a multiple of dp*mbs = " + std::to_string(per_mb);
    }
    return fail(msg);
  }
  return ok_status();
}

}  // namespace piper
