#include "piper/planner/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "piper/base/units.h"
#include "piper/planner/domain.h"
#include "piper/planner/rescore.h"
#include "piper/sim/simulate.h"

namespace piper::planner {
namespace {

bool plan_before(double time_a, int64_t item_a, int64_t off_a, double time_b, int64_t item_b, int64_t off_b) {
  if (time_a != time_b) return time_a < time_b;
  if (item_a != item_b) return item_a < item_b;
  return off_a < off_b;
}

bool plan_before(const Plan& a, const Plan& b) {
  return plan_before(a.estimate.step_time_s, a.item, a.offset, b.estimate.step_time_s, b.item, b.offset);
}

Plan make_plan(const Strategy& s, const cost::Estimate& e, int64_t item, int64_t offset) {
  Plan p;
  p.strategy = s;
  p.estimate = e;
  p.item = item;
  p.offset = offset;
  return p;
}

// What one worker accumulates.
struct Sink {
  int top_k = 1;
  double memory_limit_bytes = 0;
  std::vector<Plan> top;  // sorted, at most top_k
  bool has_smallest = false;
  Plan smallest;
  RuleCounts rejected{};
  int64_t scored = 0;
  int64_t fitting = 0;

  void offer(const Strategy& s, const cost::Estimate& e, int64_t item, int64_t offset) {
    const double mem = e.memory.total();
    if (!has_smallest || mem < smallest.peak_memory_bytes() ||
        (mem == smallest.peak_memory_bytes() && plan_before(0, item, offset, 0, smallest.item, smallest.offset))) {
      smallest = make_plan(s, e, item, offset);
      has_smallest = true;
    }
    if (!fits(e)) {
      ++rejected[static_cast<int>(Rule::kMemory)];
      return;
    }
    ++fitting;
    if (static_cast<int>(top.size()) == top_k &&
        !plan_before(e.step_time_s, item, offset, top.back().estimate.step_time_s, top.back().item,
                     top.back().offset)) {
      return;
    }
    // A plan the model cannot tell apart from a listed one (same time and memory) is listed once, the earliest.
    for (size_t i = 0; i < top.size(); ++i) {
      if (same_score(top[i], e)) {
        if (!plan_before(0, item, offset, 0, top[i].item, top[i].offset)) return;
        top.erase(top.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
    Plan p = make_plan(s, e, item, offset);
    top.insert(
        std::upper_bound(top.begin(), top.end(), p, [](const Plan& a, const Plan& b) { return plan_before(a, b); }),
        std::move(p));
    if (static_cast<int>(top.size()) > top_k) top.pop_back();
  }

  bool fits(const cost::Estimate& e) const { return e.fits && e.memory.total() <= memory_limit_bytes; }
  static bool same_score(const Plan& p, const cost::Estimate& e) {
    return p.estimate.step_time_s == e.step_time_s && p.peak_memory_bytes() == e.memory.total();
  }
};

struct Context {
  const ModelSpec* model;
  const ResolvedSpace* space;
  // One per space.mbs entry (the cost model's micro batch size), per expert-load slot: models[slot][im], where
  // slot = ep_slot(ep) (SearchOptions::expert_load_by_ep; one slot without measured loads).
  const std::vector<std::vector<cost::CostModel>>* models;
  const std::vector<int>* slot_eps;  // the ep of each slot but the last, which serves every other ep
  int ep_slot(int ep) const {
    for (size_t i = 0; i < slot_eps->size(); ++i)
      if ((*slot_eps)[i] == ep) return static_cast<int>(i);
    return static_cast<int>(slot_eps->size());
  }
  bool apply_rules;
};

Strategy gpipe_proxy(Strategy s) {
  s.schedule = "gpipe";
  s.vpp = 1;
  return s;
}

int chunks_per_rank(const std::string& schedule, int vpp) {
  return schedule == "interleaved" ? vpp : schedule == "dualpipev" ? 2 : 1;
}

// Scores every candidate of work item `index` into `sink`.
void run_item(const Context& ctx, int64_t index, Sink* sink, Strategy* s, cost::Estimate* e) {
  const ResolvedSpace& r = *ctx.space;
  const SearchSpace& sp = r.space;
  const ModelSpec& model = *ctx.model;
  const auto& item = r.items[static_cast<size_t>(index)];
  const int dp = r.world / (item.tp * item.pp);
  auto reject = [&](Rule rule, int64_t n) { sink->rejected[static_cast<int>(rule)] += n; };
  // An ep that does not divide dp but divides tp*dp is laid out as Megatron does it: folded over the stage's tp*dp
  // ranks (Strategy::fold). Where ep divides dp the unfolded layout (ep a sub-axis of dp) is searched.
  const bool fold = dp % item.ep != 0 && item.tp > 1 && (dp * item.tp) % item.ep == 0;
  if (ctx.apply_rules) {
    const bool kv_bad =
        model.attention == AttentionType::kStandard && model.num_kv_heads > 0 && model.num_kv_heads % item.tp != 0;
    if (model.num_heads % item.tp != 0 || kv_bad) return reject(Rule::kTpDividesHeads, r.item_size(item));
    if (dp % item.ep != 0 && !fold) return reject(Rule::kEpDividesDp, r.item_size(item));
  }
  const int64_t n_a2a = static_cast<int64_t>(sp.a2a.size()), n_order = static_cast<int64_t>(sp.orders.size());
  const int64_t block_rc = n_a2a * n_order;
  const int64_t block_zero = block_rc * static_cast<int64_t>(sp.recompute.size());
  const int64_t block_sched = block_zero * static_cast<int64_t>(sp.zero.size());
  const int64_t block_mbs = block_sched * static_cast<int64_t>(r.schedules.size());
  const int64_t block_sp = block_mbs * static_cast<int64_t>(sp.mbs.size());
  const int64_t block_etp = block_sp * static_cast<int64_t>(r.sp.size());
  s->tp = item.tp;
  s->pp = item.pp;
  s->dp = dp;
  s->ep = item.ep;
  s->fold = fold;
  // Mesh orders that only differ in where size-1 axes sit are one strategy: keep the first of each. Folded, the
  // layout is fixed (tp, dp, pp with the expert mesh over tp*dp): keep the first order that validates.
  std::vector<char> order_dup(sp.orders.size(), 0);
  {
    std::vector<std::vector<std::string>> reduced(sp.orders.size());
    bool kept = false;
    for (size_t o = 0; o < sp.orders.size(); ++o) {
      if (fold) {
        order_dup[o] = kept || s->folded_layout(sp.orders[o]) != s->folded_layout(Strategy{}.order);
        kept = kept || !order_dup[o];
        continue;
      }
      reduced[o] = s->order_without_unit_axes(sp.orders[o]);
      for (size_t q = 0; q < o && !order_dup[o]; ++q) order_dup[o] = reduced[q] == reduced[o];
    }
  }
  // Keep EP inside the scale-up domain when it fits (plan/domain.h): on a cluster whose domains span nodes,
  // orders that spread the EP groups over domains are not searched while another order keeps them inside.
  std::vector<char> ep_outside(sp.orders.size(), 0);
  const ClusterSpec& cluster = (*ctx.models)[0][0].cluster();
  if (ctx.apply_rules && cluster.has_multi_node_domain() && item.ep > 1) {
    const std::vector<std::string> kept_order = s->order;
    for (size_t o = 0; o < sp.orders.size(); ++o) {
      s->order = sp.orders[o];
      ep_outside[o] = ep_fits_domain(*s, cluster) && !ep_inside_domain(*s, cluster);
    }
    s->order = kept_order;
  }
  const int n_etp = static_cast<int>(r.etp_count(item.tp));
  for (int ie = 0; ie < n_etp; ++ie) {
    s->etp = ie == 0 ? 1 : item.tp;
    if (ctx.apply_rules && fold && s->etp != 1) {  // folding keeps whole experts (Strategy::validate)
      reject(Rule::kEpDividesDp, block_etp);
      continue;
    }
    for (size_t isp = 0; isp < r.sp.size(); ++isp) {
      const int64_t base_sp = ie * block_etp + static_cast<int64_t>(isp) * block_sp;
      s->sp = r.sp[isp] != 0;
      if (ctx.apply_rules) {
        if (s->sp && item.tp == 1) {
          reject(Rule::kSpNeedsTp, block_sp);
          continue;
        }
        if (!s->sp && item.tp > 1 && model.is_moe()) {
          reject(Rule::kMoeTpNeedsSp, block_sp);
          continue;
        }
      }
      for (size_t im = 0; im < sp.mbs.size(); ++im) {
        const int64_t base_mbs = base_sp + static_cast<int64_t>(im) * block_mbs;
        const int mbs = sp.mbs[im];
        const int64_t per_mb = static_cast<int64_t>(dp) * mbs;
        if (ctx.apply_rules && r.global_batch % per_mb != 0) {
          reject(Rule::kBatchDivisibility, block_mbs);
          continue;
        }
        const int64_t m = std::max<int64_t>(1, r.global_batch / per_mb);
        s->mbs = mbs;
        s->microbatches = static_cast<int>(std::min<int64_t>(m, 1 << 30));
        const cost::CostModel& cm = (*ctx.models)[static_cast<size_t>(ctx.ep_slot(item.ep))][im];
        for (size_t ih = 0; ih < r.schedules.size(); ++ih) {
          const int64_t base_sched = base_mbs + static_cast<int64_t>(ih) * block_sched;
          const auto& choice = r.schedules[ih];
          if (ctx.apply_rules) {
            Rule broken = Rule::kInvalid;
            const int stages = item.pp * chunks_per_rank(choice.schedule, choice.vpp);
            const bool needs_pp =
                choice.schedule == "1f1b" || choice.schedule == "interleaved" || choice.schedule == "zb-h1";
            if (stages > model.num_layers)
              broken = Rule::kStagesExceedLayers;
            else if (needs_pp && m < item.pp)
              broken = Rule::kMicrobatchesLtPp;
            else if (choice.schedule == "dualpipev" && m < 2 * item.pp)
              broken = Rule::kDualPipeVMicrobatches;
            else if (choice.schedule == "interleaved" && m % item.pp != 0)
              broken = Rule::kInterleavedMicrobatches;
            if (broken != Rule::kInvalid) {
              reject(broken, block_sched);
              continue;
            }
          }
          s->schedule = choice.schedule;
          s->vpp = choice.vpp;
          for (size_t iz = 0; iz < sp.zero.size(); ++iz) {
            s->zero = sp.zero[iz];
            for (size_t ir = 0; ir < sp.recompute.size(); ++ir) {
              const int64_t base_rc =
                  base_sched + static_cast<int64_t>(iz) * block_zero + static_cast<int64_t>(ir) * block_rc;
              s->recompute = sp.recompute[ir];
              bool memory_known = false, memory_fits = true;
              for (int64_t ia = 0; ia < n_a2a; ++ia) {
                s->a2a = sp.a2a[static_cast<size_t>(ia)];
                for (int64_t io = 0; io < n_order; ++io) {
                  const int64_t offset = base_rc + ia * n_order + io;
                  if (ctx.apply_rules) {
                    if (item.ep == 1 && ia > 0) {  // the a2a algorithm is unused without expert parallelism
                      reject(Rule::kDuplicateA2a, 1);
                      continue;
                    }
                    if (order_dup[static_cast<size_t>(io)]) {
                      reject(Rule::kDuplicateOrder, 1);
                      continue;
                    }
                    if (ep_outside[static_cast<size_t>(io)]) {
                      reject(Rule::kEpOutsideDomain, 1);
                      continue;
                    }
                    if (memory_known && !memory_fits) {  // memory does not depend on a2a or order
                      reject(Rule::kMemory, 1);
                      continue;
                    }
                  }
                  s->order = sp.orders[static_cast<size_t>(io)];
                  // A registered schedule has no closed form: it is kept on gpipe's (every microbatch's
                  // activations in flight, the bound on memory) and re-scored by the simulator with its own order.
                  Status st = s->schedule_kind() == ScheduleKind::kCustom ? cm.estimate(gpipe_proxy(*s), e)
                                                                          : cm.estimate(*s, e);
                  if (!st.ok()) {
                    reject(Rule::kInvalid, 1);
                    continue;
                  }
                  ++sink->scored;
                  memory_known = true;
                  memory_fits = sink->fits(*e);
                  sink->offer(*s, *e, index, offset);
                }
              }
            }
          }
        }
      }
    }
  }
}

// Compiles the kept plans best first, `threads` at a time, until top_k have verified.
void verify_plans(const ModelSpec& model, const TrainSpec& train, const SearchOptions& options,
                  const ClusterSpec& cluster, int threads, SearchResult* out) {
  const auto start = std::chrono::steady_clock::now();
  const double capacity = options.memory_fraction * static_cast<double>(cluster.device.memory_bytes);
  std::vector<Plan> kept;
  VerifyCache cache;
  size_t next = 0;
  while (static_cast<int>(kept.size()) < options.top_k && next < out->top.size()) {
    const size_t batch = std::min(out->top.size() - next, static_cast<size_t>(std::max(1, threads)));
    // Plans that may be in re-scoring's first batch keep their compile for it.
    const int first_batch = std::min(std::max(1, threads), options.simulate_top);
    const bool reuse = options.reuse_compiles && !options.verifier && !options.simulator;
    const size_t keep_compiles =
        reuse ? static_cast<size_t>(std::max(0, first_batch - static_cast<int>(kept.size()))) : 0;
    std::vector<std::thread> pool;
    for (size_t i = 0; i < batch; ++i) {
      pool.emplace_back([&, i] {
        Plan& p = out->top[next + i];
        TrainSpec t = train;
        t.micro_batch_size = p.strategy.mbs;
        const Strategy& s = p.strategy;
        VerifyOptions vo;
        vo.memory_screen = options.memory_screen;
        vo.data_edges = options.data_edges;
        vo.max_full_compile_s = options.simulate_budget_s;
        if (options.verifier) {
          p.verification = options.verifier(s, t);
        } else if (i < keep_compiles && sim::check_simulated_order(s).ok()) {
          p.verification = verify_strategy_for_simulation(model, cluster, t, s, options.calibration_for(s.ep), capacity,
                                                          &p.compiled, vo, options.verify_cache ? &cache : nullptr);
        } else if (options.verify_cache) {
          p.verification = cache.verify(model, t, s, capacity, vo);
        } else {
          p.verification = verify_strategy(model, t, s, capacity, vo);
        }
        p.verified = p.verification.ok;
      });
    }
    for (auto& th : pool) th.join();
    for (size_t i = 0; i < batch; ++i) {
      Plan& p = out->top[next + i];
      if (p.verification.cached) ++out->stats.verify_cached;
      if (p.verified) {
        ++out->stats.verified;
        if (static_cast<int>(kept.size()) < options.top_k) kept.push_back(std::move(p));
      } else {
        ++out->stats.verify_failed;
        if (p.verification.screened) ++out->stats.verify_screened;
        if (out->stats.first_verify_failure.empty()) {
          out->stats.first_verify_failure = p.strategy.to_string() + ": " + p.verification.message;
        }
      }
    }
    next += batch;
    if (options.progress) {
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      options.progress("verify: " + std::to_string(out->stats.verified) + " verified, " +
                       std::to_string(out->stats.verify_failed) + " rejected by the compiler, " + std::to_string(next) +
                       " of at most " + std::to_string(out->top.size()) + " compiled (" +
                       std::to_string(out->stats.verify_cached) + " verdicts from the cache), " + format_seconds(t));
    }
  }
  out->top = std::move(kept);
  out->stats.verify_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Result<SearchResult> run_search(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                                const SearchOptions& options, bool apply_rules, int threads) {
  const auto start = std::chrono::steady_clock::now();
  if (options.top_k < 1) return invalid_argument("plan: top_k=" + std::to_string(options.top_k) + " must be >= 1");
  if (!(options.memory_fraction > 0 && options.memory_fraction <= 1)) {
    return invalid_argument("plan: memory_fraction=" + std::to_string(options.memory_fraction) +
                            " must be in (0, 1]; e.g. 0.95 keeps 5 % of device memory free");
  }
  if (threads < 1) return invalid_argument("plan: threads=" + std::to_string(threads) + " must be >= 1");
  if (options.verify && options.verify_attempts_per_plan < 1) {
    return invalid_argument("plan: verify_attempts_per_plan must be >= 1");
  }
  if (options.simulate_top < 0 || options.local_search_steps < 0 || !(options.simulate_budget_s >= 0)) {
    return invalid_argument("plan: simulate_top=" + std::to_string(options.simulate_top) +
                            ", local_search_steps=" + std::to_string(options.local_search_steps) +
                            " and simulate_budget_s=" + std::to_string(options.simulate_budget_s) +
                            " must be >= 0 (0 turns the simulator off)");
  }
  PIPER_RETURN_IF_ERROR(train.validate());
  PIPER_ASSIGN_OR_RETURN(ResolvedSpace space, resolve_space(options.space, model, cluster, train.global_batch));
  std::vector<int> slot_eps;
  for (const auto& [ep, load] : options.expert_load_by_ep) slot_eps.push_back(ep);
  std::vector<std::vector<cost::CostModel>> models(slot_eps.size() + 1);
  for (size_t slot = 0; slot < models.size(); ++slot) {
    const cost::Calibration cal =
        slot < slot_eps.size() ? options.calibration_for(slot_eps[slot]) : options.calibration;
    for (int mbs : space.space.mbs) {
      TrainSpec t = train;
      t.micro_batch_size = mbs;
      PIPER_ASSIGN_OR_RETURN(cost::CostModel cm, cost::CostModel::create(model, cluster, t, cal));
      if (!options.memoise_closed_form) {
        cm.set_halo_memo(false);
      } else if (slot > 0 || !models[0].empty()) {
        cm.share_halo_memo(models[0].front());
      }
      models[slot].push_back(std::move(cm));
    }
  }
  Context ctx{&model, &space, &models, &slot_eps, apply_rules};
  std::vector<Sink> sinks(static_cast<size_t>(threads));
  std::atomic<int64_t> next{0};
  const int64_t n_items = static_cast<int64_t>(space.items.size());
  const bool verify = apply_rules && options.verify;
  const int keep = verify ? options.top_k * std::max(1, options.verify_attempts_per_plan) : options.top_k;
  auto worker = [&](Sink* sink) {
    sink->top_k = keep;
    sink->memory_limit_bytes = options.memory_fraction * static_cast<double>(cluster.device.memory_bytes);
    Strategy s;
    cost::Estimate e;
    for (int64_t i = next.fetch_add(1); i < n_items; i = next.fetch_add(1)) run_item(ctx, i, sink, &s, &e);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker, &sinks[static_cast<size_t>(t)]);
  worker(&sinks[0]);
  for (auto& th : pool) th.join();

  SearchResult out;
  out.stats.considered = space.total();
  out.stats.threads = threads;
  for (auto& sink : sinks) {
    out.stats.scored += sink.scored;
    out.stats.fitting += sink.fitting;
    for (int k = 0; k < kNumRules; ++k) out.stats.rejected[k] += sink.rejected[k];
    for (auto& p : sink.top) out.top.push_back(std::move(p));
    if (sink.has_smallest &&
        (!out.has_smallest || sink.smallest.peak_memory_bytes() < out.smallest.peak_memory_bytes() ||
         (sink.smallest.peak_memory_bytes() == out.smallest.peak_memory_bytes() &&
          plan_before(0, sink.smallest.item, sink.smallest.offset, 0, out.smallest.item, out.smallest.offset)))) {
      out.smallest = sink.smallest;
      out.has_smallest = true;
    }
  }
  std::sort(out.top.begin(), out.top.end(), [](const Plan& a, const Plan& b) { return plan_before(a, b); });
  std::vector<Plan> distinct;
  for (auto& p : out.top) {
    bool seen = false;
    for (const auto& q : distinct) seen = seen || Sink::same_score(q, p.estimate);
    if (!seen) distinct.push_back(std::move(p));
  }
  out.top = std::move(distinct);
  if (static_cast<int>(out.top.size()) > keep) out.top.resize(static_cast<size_t>(keep));
  out.stats.search_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (options.progress) {
    options.progress("search: " + std::to_string(out.stats.scored) + " candidates scored, " +
                     std::to_string(out.stats.fitting) + " fit, " + format_seconds(out.stats.search_time_s));
  }
  if (verify) {
    verify_plans(model, train, options, cluster, threads, &out);
  } else if (static_cast<int>(out.top.size()) > options.top_k) {
    out.top.resize(static_cast<size_t>(options.top_k));
  }
  if (apply_rules && (options.simulate_top > 0 || options.local_search_steps > 0)) {
    rescore_with_simulator(model, cluster, train, options, threads, &out);
  }
  return out;
}

}  // namespace

int64_t SearchStats::rejected_total() const {
  int64_t n = 0;
  for (int64_t r : rejected) n += r;
  return n;
}

Result<SearchResult> search(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                            const SearchOptions& options) {
  return run_search(model, cluster, train, options, /*apply_rules=*/true, options.threads);
}

Result<SearchResult> brute_force(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                                 const SearchOptions& options) {
  return run_search(model, cluster, train, options, /*apply_rules=*/false, 1);
}

cost::Calibration SearchOptions::calibration_for(int ep) const {
  cost::Calibration c = calibration;
  if (auto it = expert_load_by_ep.find(ep); it != expert_load_by_ep.end()) {
    c.expert_load_imbalance = it->second.time;
    c.expert_memory_load = it->second.memory;
  }
  return c;
}

}  // namespace piper::planner
