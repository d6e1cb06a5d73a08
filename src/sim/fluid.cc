#include "piper/sim/fluid.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "piper/base/check.h"

namespace piper::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// A flow with less than this fraction of its bytes left is done (rounding of left - rate * dt).
constexpr double kDoneFraction = 1e-9;
// Relative clock resolution: transfers this close to their end count as finished.
constexpr double kClockSlack = 1e-12;

// The smallest of x[0..n) (+infinity when n = 0), with four running minima: min is exact, so the order does not
// change the result, and the scan runs at the speed of its loads instead of one comparison chain.
double min_of(const double* x, size_t n) {
  double m0 = kInf, m1 = kInf, m2 = kInf, m3 = kInf;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    m0 = std::min(m0, x[i]);
    m1 = std::min(m1, x[i + 1]);
    m2 = std::min(m2, x[i + 2]);
    m3 = std::min(m3, x[i + 3]);
  }
  for (; i < n; ++i) m0 = std::min(m0, x[i]);
  return std::min(std::min(m0, m1), std::min(m2, m3));
}

}  // namespace

void FlowTemplate::finalize() {
  for (Flow& f : flows) f.children.clear();
  for (size_t i = 0; i < flows.size(); ++i) {
    for (int a : flows[i].after) {
      PIPER_CHECK(a >= 0 && static_cast<size_t>(a) < i, "flow ", i, " waits for flow ", a, " that is not earlier");
      flows[static_cast<size_t>(a)].children.push_back(static_cast<int>(i));
    }
  }
}

FluidNet::FluidNet(std::vector<double> link_bw_bytes_per_s, bool local_rates, bool due_filter)
    : link_bw_(std::move(link_bw_bytes_per_s)), local_rates_(local_rates), due_filter_(due_filter) {
  for (double bw : link_bw_) PIPER_CHECK(std::isfinite(bw) && bw > 0, "link bandwidth ", bw);
}

int FluidNet::new_transfer() {
  ++live_transfers_;
  if (!free_transfers_.empty()) {
    int id = free_transfers_.back();
    free_transfers_.pop_back();
    return id;
  }
  transfers_.emplace_back();
  return static_cast<int>(transfers_.size()) - 1;
}

void FluidNet::start(const FlowTemplate* tmpl, double payload, double now, int64_t token) {
  PIPER_CHECK(now >= now_ - 1e-12 * std::max(1.0, now_), "transfer started in the past: ", now, " < ", now_);
  const int id = new_transfer();
  Transfer& tr = transfers_[static_cast<size_t>(id)];
  tr.tmpl = tmpl;
  tr.payload = payload;
  tr.token = token;
  tr.flows_left = static_cast<int>(tmpl->flows.size());
  tr.waiting.resize(tmpl->flows.size());
  if (tr.flows_left == 0) {
    done_tokens_.push_back(token);
    transfers_[static_cast<size_t>(id)].tmpl = nullptr;
    free_transfers_.push_back(id);
    --live_transfers_;
    return;
  }
  for (size_t f = 0; f < tmpl->flows.size(); ++f) {
    tr.waiting[f] = static_cast<int>(tmpl->flows[f].after.size());
    if (tr.waiting[f] == 0) timers_.push({now + tmpl->flows[f].latency_s, {id, static_cast<int>(f)}});
  }
}

void FluidNet::flow_ready(int transfer, int flow, double t) {
  const Transfer& tr = transfers_[static_cast<size_t>(transfer)];
  const FlowTemplate::Flow& f = tr.tmpl->flows[static_cast<size_t>(flow)];
  const double bytes = f.bytes * tr.payload;
  ++flows_started_;
  if (f.hops.empty() || bytes <= 0) {
    flow_done(transfer, flow, t);
    return;
  }
  add_active(transfer, flow, bytes);
  dirty_ = true;
}

void FluidNet::flow_done(int transfer, int flow, double t) {
  Transfer& tr = transfers_[static_cast<size_t>(transfer)];
  const FlowTemplate::Flow& f = tr.tmpl->flows[static_cast<size_t>(flow)];
  for (int c : f.children) {
    if (--tr.waiting[static_cast<size_t>(c)] == 0) {
      timers_.push({t + tr.tmpl->flows[static_cast<size_t>(c)].latency_s, {transfer, c}});
    }
  }
  if (--tr.flows_left == 0) {
    done_tokens_.push_back(tr.token);
    tr.tmpl = nullptr;
    free_transfers_.push_back(transfer);
    --live_transfers_;
  }
}

void FluidNet::add_active(int transfer, int flow, double bytes) {
  if (members_.size() != link_bw_.size()) {
    members_.resize(link_bw_.size());
    link_pos_.assign(link_bw_.size(), -1);
    weight_.assign(link_bw_.size(), 0.0);
    weight_sum_.assign(link_bw_.size(), 0.0);
    left_.assign(link_bw_.size(), 0.0);
    saturated_link_.assign(link_bw_.size(), 0);
    load_.assign(link_bw_.size(), 0.0);
    link_mark_.assign(link_bw_.size(), 0);
    inside_count_.assign(link_bw_.size(), 0);
    inside_load_.assign(link_bw_.size(), 0.0);
  }
  // Slots past num_active_ keep their member_pos storage: a flow start allocates nothing once the net is warm.
  const int id = static_cast<int>(num_active_);
  fresh_.push_back(id);
  if (num_active_ == active_.size()) {
    active_.emplace_back();
    rate_.push_back(0);
    finish_.push_back(0);
    due_.push_back(0);
    done_bytes_.push_back(0);
  }
  ++num_active_;
  Active& a = active_[static_cast<size_t>(id)];
  a.transfer = transfer;
  a.flow = flow;
  a.left = bytes;
  const auto slot = static_cast<size_t>(id);
  rate_[slot] = 0.0;
  finish_[slot] = kInf;
  due_[slot] = kInf;
  done_bytes_[slot] = kDoneFraction * bytes;
  a.hops = &transfers_[static_cast<size_t>(transfer)].tmpl->flows[static_cast<size_t>(flow)].hops;
  a.fresh = true;
  const std::vector<Hop>& hops = hops_of(a);
  a.member_pos.resize(hops.size());
  for (size_t k = 0; k < hops.size(); ++k) {
    const auto l = static_cast<size_t>(hops[k].link);
    if (members_[l].empty()) {
      link_pos_[l] = static_cast<int>(links_.size());
      links_.push_back(hops[k].link);
    }
    a.member_pos[k] = static_cast<int>(members_[l].size());
    members_[l].push_back({id, static_cast<int>(k), hops[k].weight});
    weight_sum_[l] += hops[k].weight;
  }
}

void FluidNet::remove_active(size_t i) {
  // Out of the member lists of its links (swap with the last member), then out of active_ (swap with the last
  // flow, whose member entries are renumbered).
  {
    const Active& a = active_[i];
    const double rate = rate_[i];
    if (a.fresh) fresh_.erase(std::find(fresh_.begin(), fresh_.end(), static_cast<int>(i)));
    const std::vector<Hop>& hops = hops_of(a);
    for (size_t k = 0; k < hops.size(); ++k) {
      const auto l = static_cast<size_t>(hops[k].link);
      load_[l] -= hops[k].weight * rate;
      if (saturated_link_[l]) seed_links_.push_back(hops[k].link);  // its other flows may speed up
      auto& mem = members_[l];
      const auto p = static_cast<size_t>(a.member_pos[k]);
      mem[p] = mem.back();
      mem.pop_back();
      weight_sum_[l] = mem.empty() ? 0.0 : weight_sum_[l] - hops[k].weight;  // exact again when it empties
      if (p < mem.size())
        active_[static_cast<size_t>(mem[p].flow)].member_pos[static_cast<size_t>(mem[p].hop)] = static_cast<int>(p);
      if (mem.empty()) {
        const auto lp = static_cast<size_t>(link_pos_[l]);
        links_[lp] = links_.back();
        link_pos_[static_cast<size_t>(links_[lp])] = static_cast<int>(lp);
        links_.pop_back();
        link_pos_[l] = -1;
        load_[l] = 0;
        saturated_link_[l] = 0;
      }
    }
  }
  const size_t last = num_active_ - 1;
  if (i != last) {
    std::swap(active_[i], active_[last]);
    set_slot(i, last);
    const Active& moved = active_[i];
    if (moved.fresh) *std::find(fresh_.begin(), fresh_.end(), static_cast<int>(last)) = static_cast<int>(i);
    const std::vector<Hop>& hops = hops_of(moved);
    for (size_t k = 0; k < hops.size(); ++k) {
      members_[static_cast<size_t>(hops[k].link)][static_cast<size_t>(moved.member_pos[k])].flow = static_cast<int>(i);
    }
  }
  --num_active_;
}

void FluidNet::set_slot(size_t i, size_t from) {
  rate_[i] = rate_[from];
  finish_[i] = finish_[from];
  due_[i] = due_[from];
  done_bytes_[i] = done_bytes_[from];
}

void FluidNet::recompute_rates() {
  if (!local_rates_ || !recompute_local()) recompute_all();
  fresh_.clear();
  seed_links_.clear();
  // Every flow's finish time is valid until the set of transferring flows changes again.
  // Minima in locals, two of each (min is exact, so the order does not matter): the scan runs at the speed of
  // loads, not of a chain of stores to the members.
  next_finish_ = min_of(finish_.data(), num_active_);
  next_due_ = min_of(due_.data(), num_active_);
  dirty_ = false;
  ++rate_updates_;
}

void FluidNet::recompute_all() {
  const size_t nf = num_active_;
  frozen_.assign(nf, 0);
  new_rate_.resize(nf);
  for (int l : links_) {
    weight_[static_cast<size_t>(l)] = weight_sum_[static_cast<size_t>(l)];
    left_[static_cast<size_t>(l)] = link_bw_[static_cast<size_t>(l)];
  }
  ++mark_epoch_;  // no link is shared with flows outside the computation
  fill(nf, links_);
  component_flows_.resize(nf);
  for (size_t f = 0; f < nf; ++f) component_flows_[f] = f;
  apply_rates();
  for (int l : links_) load_[static_cast<size_t>(l)] = 0;  // exact again, free of the local updates' rounding
  for (size_t f = 0; f < num_active_; ++f) {
    const double rate = rate_[f];
    for (const Hop& h : hops_of(active_[f])) load_[static_cast<size_t>(h.link)] += h.weight * rate;
  }
  ++full_rate_updates_;
}

bool FluidNet::recompute_local() {
  // The component: fresh flows, and every flow reachable from them, or from saturated links that ended flows
  // left, through links that were saturated. frozen_ marks flows outside it (their rates stay).
  const size_t nf = num_active_;
  frozen_.assign(nf, 1);
  new_rate_.resize(nf);
  mark_epoch_ += 2;
  const int visited = mark_epoch_, shared = mark_epoch_ + 1;
  component_flows_.clear();
  component_links_.clear();
  std::vector<int>& todo = seed_links_;  // consumed as a stack
  auto take = [&](size_t f) {
    frozen_[f] = 0;
    component_flows_.push_back(f);
    for (const Hop& h : hops_of(active_[f])) todo.push_back(h.link);
  };
  for (int f : fresh_) take(static_cast<size_t>(f));
  while (!todo.empty()) {
    const auto l = static_cast<size_t>(todo.back());
    todo.pop_back();
    if (link_mark_[l] >= visited || members_[l].empty()) continue;
    link_mark_[l] = visited;
    component_links_.push_back(static_cast<int>(l));
    if (!saturated_link_[l]) continue;
    for (const Member& m : members_[l]) {
      if (frozen_[static_cast<size_t>(m.flow)]) take(static_cast<size_t>(m.flow));
    }
  }
  for (int l : component_links_) {
    inside_count_[static_cast<size_t>(l)] = 0;
    inside_load_[static_cast<size_t>(l)] = 0;
    weight_[static_cast<size_t>(l)] = 0;
  }
  for (size_t f : component_flows_) {
    for (const Hop& h : hops_of(active_[f])) {
      const auto l = static_cast<size_t>(h.link);
      ++inside_count_[l];
      inside_load_[l] += h.weight * rate_[f];
      weight_[l] += h.weight;
    }
  }
  for (int li : component_links_) {
    const auto l = static_cast<size_t>(li);
    left_[l] = link_bw_[l];
    if (static_cast<size_t>(inside_count_[l]) < members_[l].size()) {  // the capacity the others leave
      link_mark_[l] = shared;
      left_[l] -= load_[l] - inside_load_[l];
    }
  }
  if (!fill(component_flows_.size(), component_links_)) return false;
  apply_rates();
  return true;
}

bool FluidNet::fill(size_t unfrozen, const std::vector<int>& links) {
  // Progressive filling (flow_sim.h's max_min_rates) over `links`, for the flows not frozen_. Every link keeps its
  // member list up to date as flows start and end (add_active / remove_active), so a call costs O(members +
  // touched links x rounds + flows x hops) with small constants: nothing is rebuilt, the weight of each link's
  // members is summed as they come and go, the last round subtracts nothing. Returns false when a link shared
  // with flows outside the computation saturates (recompute_local() then gives way to recompute_all()).
  for (int l : links) saturated_link_[static_cast<size_t>(l)] = 0;
  const int shared = mark_epoch_ + 1;
  double level = 0;
  while (unfrozen > 0) {
    double inc = kInf;
    for (int l : links) {
      const auto i = static_cast<size_t>(l);
      if (weight_[i] > 0) inc = std::min(inc, left_[i] / weight_[i]);
    }
    PIPER_CHECK(std::isfinite(inc), "an active flow crosses no loaded link");
    level += inc;
    saturated_.clear();
    for (int l : links) {
      const auto i = static_cast<size_t>(l);
      if (weight_[i] <= 0) continue;
      left_[i] -= inc * weight_[i];
      if (left_[i] <= 4e-12 * link_bw_[i]) {
        if (link_mark_[i] == shared) return false;
        saturated_.push_back(i);
      }
    }
    just_frozen_.clear();
    for (size_t i : saturated_) {
      saturated_link_[i] = 1;
      for (const Member& m : members_[i]) {
        const auto f = static_cast<size_t>(m.flow);
        if (frozen_[f]) continue;
        frozen_[f] = 1;
        new_rate_[f] = level;
        just_frozen_.push_back(f);
      }
      weight_[i] = 0;
    }
    unfrozen -= just_frozen_.size();
    if (unfrozen == 0) break;  // the last round: nobody needs the weights any more
    for (size_t f : just_frozen_) {
      for (const Hop& h : hops_of(active_[f])) weight_[static_cast<size_t>(h.link)] -= h.weight;
    }
  }
  return true;
}

void FluidNet::apply_rates() {
  // Absolute finish times of the flows just computed; a flow whose rate did not change keeps its own.
  for (size_t f : component_flows_) {
    Active& a = active_[f];
    a.fresh = false;
    double& rate = rate_[f];
    if (new_rate_[f] == rate) continue;
    for (const Hop& h : hops_of(a)) load_[static_cast<size_t>(h.link)] += h.weight * (new_rate_[f] - rate);
    if (rate > 0) a.left = std::max(0.0, rate * (finish_[f] - now_));  // bytes left at now_ at the old rate
    rate = new_rate_[f];
    finish_[f] = now_ + a.left / rate;
    due_[f] = finish_[f] - done_bytes_[f] / rate;  // advance()'s done test
  }
}

double FluidNet::next_time() {
  if (!done_tokens_.empty()) return now_;
  if (dirty_) recompute_rates();
  const double t = timers_.empty() ? kInf : timers_.top().first;
  return std::min(t, next_finish_);
}

void FluidNet::advance(double t, std::vector<int64_t>* completed) {
  if (dirty_) recompute_rates();
  now_ = std::max(now_, t);
  const double slack = kClockSlack * std::max(1.0, now_);
  // Rates are constant between recomputations, so no flow can pass the done test below before next_due_: the
  // scan is skipped unless some flow is due.
  if (num_active_ > 0 && next_due_ <= now_ + slack) {
    finished_.clear();
    // A flow due after `skip_after` cannot pass the done test (docs/simulator.md, "Session 17": its finish is
    // then later than now_ + slack by more than what it has to be within, with a margin of 1e-9 relative to the
    // clock that covers the rounding of due_, finish_ - now_ and the product a million times over), so the scan
    // tests only due_ for most flows; the flows it tests in full, and the order it removes them in, are unchanged.
    const double skip_after = due_filter_ ? now_ + slack + 1e-9 * std::max(1.0, now_) : kInf;
    for (size_t i = 0;;) {
      const double* due = due_.data();  // remove_active() moves entries, never the arrays
      const size_t n = num_active_;
      while (i < n && due[i] > skip_after) ++i;
      if (i == n) break;
      const double remaining = std::max(0.0, finish_[i] - now_);
      // Done when (almost) nothing is left, or when what is left cannot move time forward any more (it would
      // finish within rounding of the clock: without this the loop could stall on a zero-length step).
      if (rate_[i] * remaining <= done_bytes_[i] || remaining <= slack) {
        finished_.emplace_back(active_[i].transfer, active_[i].flow);
        remove_active(i);
        dirty_ = true;
      } else {
        ++i;
      }
    }
    for (auto [tr, f] : finished_) flow_done(tr, f, now_);
  }
  while (!timers_.empty() && timers_.top().first <= now_ + slack) {
    auto [tr, f] = timers_.top().second;
    timers_.pop();
    flow_ready(tr, f, now_);
  }
  completed->insert(completed->end(), done_tokens_.begin(), done_tokens_.end());
  done_tokens_.clear();
}

}  // namespace piper::sim
