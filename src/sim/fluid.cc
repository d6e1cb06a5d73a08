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

FluidNet::FluidNet(std::vector<double> link_bw_bytes_per_s) : link_bw_(std::move(link_bw_bytes_per_s)) {
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
  }
  const int id = static_cast<int>(active_.size());
  active_.push_back({transfer,
                     flow,
                     bytes,
                     0.0,
                     bytes,
                     kInf,
                     kInf,
                     &transfers_[static_cast<size_t>(transfer)].tmpl->flows[static_cast<size_t>(flow)].hops,
                     {}});
  Active& a = active_.back();
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
    const std::vector<Hop>& hops = hops_of(a);
    for (size_t k = 0; k < hops.size(); ++k) {
      const auto l = static_cast<size_t>(hops[k].link);
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
      }
    }
  }
  const size_t last = active_.size() - 1;
  if (i != last) {
    std::swap(active_[i], active_[last]);
    const Active& moved = active_[i];
    const std::vector<Hop>& hops = hops_of(moved);
    for (size_t k = 0; k < hops.size(); ++k) {
      members_[static_cast<size_t>(hops[k].link)][static_cast<size_t>(moved.member_pos[k])].flow = static_cast<int>(i);
    }
  }
  active_.pop_back();
}

void FluidNet::recompute_rates() {
  // Progressive filling (flow_sim.h's max_min_rates) over the links that active flows cross. Every link keeps its
  // member list up to date as flows start and end (add_active / remove_active), so a call costs O(members +
  // touched links x rounds + flows x hops) with small constants: nothing is rebuilt, the weight of each link's
  // members is summed as they come and go, the last round subtracts nothing, and only flows whose rate changed get
  // a new finish time.
  const size_t nf = active_.size();
  frozen_.assign(nf, 0);
  new_rate_.resize(nf);
  for (int l : links_) {
    weight_[static_cast<size_t>(l)] = weight_sum_[static_cast<size_t>(l)];
    left_[static_cast<size_t>(l)] = link_bw_[static_cast<size_t>(l)];
  }
  size_t unfrozen = nf;
  double level = 0;
  while (unfrozen > 0) {
    double inc = kInf;
    for (int l : links_) {
      const auto i = static_cast<size_t>(l);
      if (weight_[i] > 0) inc = std::min(inc, left_[i] / weight_[i]);
    }
    PIPER_CHECK(std::isfinite(inc), "an active flow crosses no loaded link");
    level += inc;
    saturated_.clear();
    for (int l : links_) {
      const auto i = static_cast<size_t>(l);
      if (weight_[i] <= 0) continue;
      left_[i] -= inc * weight_[i];
      if (left_[i] <= 4e-12 * link_bw_[i]) saturated_.push_back(i);
    }
    just_frozen_.clear();
    for (size_t i : saturated_) {
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
  // Absolute finish times; a flow whose rate did not change keeps its own, and all stay valid until the set of
  // transferring flows changes.
  next_finish_ = next_due_ = kInf;
  for (size_t f = 0; f < nf; ++f) {
    Active& a = active_[f];
    if (new_rate_[f] != a.rate) {
      if (a.rate > 0) a.left = std::max(0.0, a.rate * (a.finish - now_));  // bytes left at now_ at the old rate
      a.rate = new_rate_[f];
      a.finish = now_ + a.left / a.rate;
      a.due = a.finish - kDoneFraction * a.bytes / a.rate;  // advance()'s done test
    }
    next_finish_ = std::min(next_finish_, a.finish);
    next_due_ = std::min(next_due_, a.due);
  }
  dirty_ = false;
  ++rate_updates_;
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
  if (!active_.empty() && next_due_ <= now_ + slack) {
    finished_.clear();
    for (size_t i = 0; i < active_.size();) {
      Active& a = active_[i];
      const double remaining = std::max(0.0, a.finish - now_);
      // Done when (almost) nothing is left, or when what is left cannot move time forward any more (it would
      // finish within rounding of the clock: without this the loop could stall on a zero-length step).
      if (a.rate * remaining <= kDoneFraction * a.bytes || remaining <= slack) {
        finished_.emplace_back(a.transfer, a.flow);
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
