// The deadlock check of verify_plan, shown complete on small plans: for every schedule x pp 1..4 x microbatches
// 1..4 (with and without dp/ep collectives) and for seeded mutations of each plan (two instructions swapped, one
// moved, a whole stream shuffled), verify_plan's verdict must equal that of two independent oracles written here:
//   1. a dependency graph: an instruction depends on its stream predecessor, a wait on the record of its event
//      (same rank), a send and its receive are one rendezvous node; the plan deadlocks iff a wait has no record
//      or the graph has a cycle (iterative DFS);
//   2. a random-order executor of blocking semantics: at each step one enabled head instruction, chosen by a
//      seeded generator, completes (a wait once its event is recorded, a send together with its receive when
//      both are at the heads of their streams, everything else at once); the plan deadlocks iff it stops early.
// Collectives complete when reached: the members of a dp/ep/tp group run the same program template, so in a
// template's execution all members reach a collective together (verify_plan.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <tuple>

#include "piper/base/check.h"
#include "piper/compile/compile.h"
#include "piper/compile/verify_plan.h"
#include "piper/spec/model_loader.h"

namespace piper::compile {
namespace {

struct Ref {
  int prog, stream;
  size_t pos;
};

// Every instruction of a plan, numbered; with the send/receive matching and the records of each event.
struct Index {
  std::vector<Ref> refs;
  std::map<std::tuple<int, int, size_t>, int> id;
  std::map<std::pair<int, int64_t>, int> send_of, recv_of;  // (sender rank, tag) -> instruction
  std::map<std::pair<int, int>, std::vector<int>> records;  // (rank, event) -> instructions

  explicit Index(const Plan& plan) {
    for (int p = 0; p < static_cast<int>(plan.templates.size()); ++p) {
      const auto& streams = plan.templates[static_cast<size_t>(p)].streams;
      for (int s = 0; s < static_cast<int>(streams.size()); ++s) {
        for (size_t i = 0; i < streams[static_cast<size_t>(s)].instrs.size(); ++i) {
          const Instruction& in = streams[static_cast<size_t>(s)].instrs[i];
          const int n = static_cast<int>(refs.size());
          refs.push_back({p, s, i});
          id[{p, s, i}] = n;
          if (in.op == OpKind::kSend) send_of[{p, in.tag}] = n;
          if (in.op == OpKind::kRecv) recv_of[{in.peer, in.tag}] = n;
          if (in.op == OpKind::kRecord) records[{p, in.event}].push_back(n);
        }
      }
    }
  }
  const Instruction& at(const Plan& plan, int n) const {
    const Ref& r = refs[static_cast<size_t>(n)];
    return plan.templates[static_cast<size_t>(r.prog)].streams[static_cast<size_t>(r.stream)].instrs[r.pos];
  }
  int partner(const Plan& plan, int n) const {
    const Instruction& in = at(plan, n);
    const int p = refs[static_cast<size_t>(n)].prog;
    if (in.op == OpKind::kSend) return recv_of.at({p, in.tag});
    return send_of.at({in.peer, in.tag});
  }
};

// Oracle 1: the dependency graph has a cycle, or a wait has no record. nullopt when an event has several records
// (a wait would depend on any one of them, which an AND graph cannot say); counted, none seen so far.
std::optional<bool> deadlocks_by_graph(const Plan& plan) {
  const Index ix(plan);
  const int n = static_cast<int>(ix.refs.size());
  std::vector<int> rep(static_cast<size_t>(n));  // rendezvous node of an instruction
  for (int i = 0; i < n; ++i) {
    const OpKind op = ix.at(plan, i).op;
    rep[static_cast<size_t>(i)] = op == OpKind::kSend || op == OpKind::kRecv ? std::min(i, ix.partner(plan, i)) : i;
  }
  std::vector<std::vector<int>> preds(static_cast<size_t>(n));  // on rendezvous nodes
  for (int i = 0; i < n; ++i) {
    const Ref& r = ix.refs[static_cast<size_t>(i)];
    const int node = rep[static_cast<size_t>(i)];
    if (r.pos > 0)
      preds[static_cast<size_t>(node)].push_back(rep[static_cast<size_t>(ix.id.at({r.prog, r.stream, r.pos - 1}))]);
    const Instruction& in = ix.at(plan, i);
    if (in.op == OpKind::kWait) {
      auto it = ix.records.find({r.prog, in.event});
      if (it == ix.records.end()) return true;  // waits forever
      if (it->second.size() != 1) return std::nullopt;
      preds[static_cast<size_t>(node)].push_back(rep[static_cast<size_t>(it->second[0])]);
    }
  }
  // Iterative DFS cycle detection: 0 new, 1 on the stack, 2 done.
  std::vector<int> color(static_cast<size_t>(n), 0);
  for (int start = 0; start < n; ++start) {
    if (rep[static_cast<size_t>(start)] != start || color[static_cast<size_t>(start)] != 0) continue;
    std::vector<std::pair<int, size_t>> stack = {{start, 0}};
    color[static_cast<size_t>(start)] = 1;
    while (!stack.empty()) {
      auto& [v, next] = stack.back();
      const auto& ps = preds[static_cast<size_t>(v)];
      if (next == ps.size()) {
        color[static_cast<size_t>(v)] = 2;
        stack.pop_back();
        continue;
      }
      const int w = ps[next++];
      if (color[static_cast<size_t>(w)] == 1) return true;
      if (color[static_cast<size_t>(w)] == 0) {
        color[static_cast<size_t>(w)] = 1;
        stack.push_back({w, 0});
      }
    }
  }
  return false;
}

// Oracle 2: blocking execution in a random order.
bool deadlocks_by_execution(const Plan& plan, uint32_t seed) {
  const Index ix(plan);
  std::mt19937 rng(seed);
  std::vector<std::vector<size_t>> head;
  for (const Program& p : plan.templates) head.emplace_back(p.streams.size(), 0);
  std::set<std::pair<int, int>> recorded;
  size_t left = ix.refs.size();
  auto head_id = [&](int p, int s) -> int {
    const auto& instrs = plan.templates[static_cast<size_t>(p)].streams[static_cast<size_t>(s)].instrs;
    const size_t h = head[static_cast<size_t>(p)][static_cast<size_t>(s)];
    return h < instrs.size() ? ix.id.at({p, s, h}) : -1;
  };
  while (left > 0) {
    std::vector<int> enabled;
    for (int p = 0; p < static_cast<int>(head.size()); ++p) {
      for (int s = 0; s < static_cast<int>(head[static_cast<size_t>(p)].size()); ++s) {
        const int i = head_id(p, s);
        if (i < 0) continue;
        const Instruction& in = ix.at(plan, i);
        bool ok = true;
        if (in.op == OpKind::kWait) ok = recorded.count({p, in.event}) > 0;
        if (in.op == OpKind::kSend || in.op == OpKind::kRecv) {
          const Ref& other = ix.refs[static_cast<size_t>(ix.partner(plan, i))];
          ok = head_id(other.prog, other.stream) == ix.partner(plan, i);
        }
        if (ok) enabled.push_back(i);
      }
    }
    if (enabled.empty()) return true;
    const int i = enabled[std::uniform_int_distribution<size_t>(0, enabled.size() - 1)(rng)];
    std::vector<int> done = {i};
    const Instruction& in = ix.at(plan, i);
    if (in.op == OpKind::kSend || in.op == OpKind::kRecv) done.push_back(ix.partner(plan, i));
    for (int d : done) {
      const Ref& r = ix.refs[static_cast<size_t>(d)];
      const Instruction& x = ix.at(plan, d);
      if (x.op == OpKind::kRecord) recorded.insert({r.prog, x.event});
      ++head[static_cast<size_t>(r.prog)][static_cast<size_t>(r.stream)];
      --left;
    }
  }
  return false;
}

// One seeded change of instruction order inside one stream (matching and events stay as they were).
Plan mutate(Plan plan, std::mt19937& rng) {
  std::vector<std::pair<size_t, size_t>> candidates;
  for (size_t p = 0; p < plan.templates.size(); ++p) {
    for (size_t s = 0; s < plan.templates[p].streams.size(); ++s) {
      if (plan.templates[p].streams[s].instrs.size() >= 2) candidates.push_back({p, s});
    }
  }
  PIPER_CHECK(!candidates.empty());
  auto [p, s] = candidates[std::uniform_int_distribution<size_t>(0, candidates.size() - 1)(rng)];
  auto& instrs = plan.templates[p].streams[s].instrs;
  std::uniform_int_distribution<size_t> pos(0, instrs.size() - 1);
  switch (std::uniform_int_distribution<int>(0, 2)(rng)) {
    case 0:
      std::swap(instrs[pos(rng)], instrs[pos(rng)]);
      break;
    case 1: {
      const size_t from = pos(rng), to = pos(rng);
      Instruction moved = instrs[from];
      instrs.erase(instrs.begin() + static_cast<std::ptrdiff_t>(from));
      instrs.insert(instrs.begin() + static_cast<std::ptrdiff_t>(to), moved);
      break;
    }
    default:
      std::shuffle(instrs.begin(), instrs.end(), rng);
  }
  return plan;
}

struct Tally {
  int plans = 0, mutated = 0, deadlocked = 0, agreed = 0, graph_skipped = 0;
};

// verify_plan's verdict against both oracles; returns whether the plan deadlocks.
bool check_agreement(const Plan& plan, const std::string& what, uint32_t seed, Tally* tally) {
  auto verdict = verify_plan(plan);
  const bool verify_deadlock = !verdict.ok();
  if (!verdict.ok()) {
    EXPECT_NE(verdict.status().message().find("deadlock"), std::string::npos)
        << what << ": " << verdict.status().message();
  }
  const std::optional<bool> by_graph = deadlocks_by_graph(plan);
  tally->graph_skipped += by_graph.has_value() ? 0 : 1;
  const bool graph = by_graph.value_or(verify_deadlock);
  const bool run1 = deadlocks_by_execution(plan, seed);
  const bool run2 = deadlocks_by_execution(plan, seed * 7919 + 1);
  EXPECT_EQ(verify_deadlock, graph) << what;
  EXPECT_EQ(verify_deadlock, run1) << what;
  EXPECT_EQ(verify_deadlock, run2) << what;
  if (verify_deadlock == graph && graph == run1 && run1 == run2) ++tally->agreed;
  tally->deadlocked += verify_deadlock ? 1 : 0;
  return verify_deadlock;
}

TEST(VerifyCompleteTest, DeadlockVerdictAgreesWithIndependentOracles) {
  auto loaded = load_model("tiny-moe");
  PIPER_CHECK_OK(loaded.status());
  ModelSpec model = *loaded;
  model.num_layers = 8;  // room for pp*vpp and dualpipev's 2*pp stages at pp = 4
  PIPER_CHECK_OK(model.validate());
  Tally tally;
  std::mt19937 rng(20261202);
  constexpr int kMutationsPerPlan = 12;
  for (const char* schedule : {"1f1b", "gpipe", "interleaved", "zb-h1", "dualpipev"}) {
    for (const char* extra : {"", ",dp=2,ep=2,zero=1"}) {
      for (int pp = 1; pp <= 4; ++pp) {
        for (int mb = 1; mb <= 4; ++mb) {
          std::string text = std::string("schedule=") + schedule + ",pp=" + std::to_string(pp) +
                             ",microbatches=" + std::to_string(mb) + extra;
          if (std::string(schedule) == "interleaved") text += ",vpp=2";
          auto s = Strategy::parse(text);
          PIPER_CHECK_OK(s.status());
          if (!s->validate().ok()) continue;  // e.g. 1f1b with microbatches < pp
          TrainSpec train;
          train.seq_len = 16;
          train.global_batch = s->global_batch();
          auto compiled = compile_strategy(model, train, *s);
          ASSERT_TRUE(compiled.ok()) << text << ": " << compiled.status().message();
          ++tally.plans;
          EXPECT_FALSE(check_agreement(compiled->plan, text, static_cast<uint32_t>(tally.plans), &tally)) << text;
          for (int k = 0; k < kMutationsPerPlan; ++k) {
            Plan mutated = mutate(compiled->plan, rng);
            ++tally.mutated;
            check_agreement(mutated, text + " mutation " + std::to_string(k), rng(), &tally);
          }
        }
      }
    }
  }
  const int cases = tally.plans + tally.mutated;
  std::printf(
      "verify completeness: %d plans + %d mutations = %d cases, %d deadlock, %d agree with both oracles "
      "(graph oracle not applicable: %d)\n",
      tally.plans, tally.mutated, cases, tally.deadlocked, tally.agreed, tally.graph_skipped);
  EXPECT_EQ(tally.agreed, cases);
  EXPECT_EQ(tally.graph_skipped, 0);
  EXPECT_GE(tally.plans, 60);
  EXPECT_GE(tally.deadlocked, cases / 10);  // the mutations really produce deadlocks
  EXPECT_GE(cases - tally.deadlocked, tally.plans);
}

}  // namespace
}  // namespace piper::compile
