#include "piper/compile/verify_plan.h"

#include <algorithm>
#include <unordered_map>

namespace piper::compile {
namespace {

struct Loc {
  int prog = -1;
  int stream = -1;
  size_t pos = 0;
};

std::string where(const Plan& plan, int p, int s, size_t pos) {
  const Stream& st = plan.templates[static_cast<size_t>(p)].streams[static_cast<size_t>(s)];
  std::string what = "end";
  if (pos < st.instrs.size()) {
    const std::string op = to_string(st.instrs[pos].op);
    const std::string& label = st.instrs[pos].label;
    what = label.rfind(op + " ", 0) == 0 ? label : op + " " + label;  // labels such as "wait X" name their op
  }
  return "rank " + std::to_string(p) + " stream '" + st.name + "' instruction " + std::to_string(pos) + " (" + what +
         ")";
}

}  // namespace

Result<PlanStats> verify_plan(const Plan& plan, int64_t capacity) {
  const int np = static_cast<int>(plan.templates.size());
  // Match point-to-point pairs by (sender rank, tag).
  std::unordered_map<int64_t, Loc> sends, recvs;
  auto key = [np](int rank, int64_t tag) { return tag * np + rank; };
  PlanStats stats;
  stats.peak_bytes.assign(static_cast<size_t>(np), 0);
  for (int p = 0; p < np; ++p) {
    const Program& prog = plan.templates[static_cast<size_t>(p)];
    std::vector<bool> recorded;
    for (int s = 0; s < static_cast<int>(prog.streams.size()); ++s) {
      const auto& instrs = prog.streams[static_cast<size_t>(s)].instrs;
      stats.instructions += instrs.size();
      for (size_t i = 0; i < instrs.size(); ++i) {
        const Instruction& in = instrs[i];
        if (in.op == OpKind::kSend || in.op == OpKind::kRecv) {
          if (in.peer < 0 || in.peer >= np || in.peer == p) {
            return failed_precondition(where(plan, p, s, i) + ": peer rank " + std::to_string(in.peer) + " is invalid");
          }
          auto& table = in.op == OpKind::kSend ? sends : recvs;
          int64_t k = key(in.op == OpKind::kSend ? p : in.peer, in.tag);
          if (!table.emplace(k, Loc{p, s, i}).second) {
            return failed_precondition(where(plan, p, s, i) + ": a second " + to_string(in.op) + " with the same tag");
          }
        }
      }
    }
  }
  for (const auto& [k, loc] : sends) {
    auto it = recvs.find(k);
    const Instruction& in =
        plan.templates[static_cast<size_t>(loc.prog)].streams[static_cast<size_t>(loc.stream)].instrs[loc.pos];
    if (it == recvs.end() || it->second.prog != in.peer) {
      return failed_precondition(where(plan, loc.prog, loc.stream, loc.pos) +
                                 ": send has no matching receive on rank " + std::to_string(in.peer));
    }
  }
  for (const auto& [k, loc] : recvs) {
    if (!sends.count(k))
      return failed_precondition(where(plan, loc.prog, loc.stream, loc.pos) + ": receive has no matching send");
  }
  // Abstract execution.
  std::vector<std::vector<size_t>> head(static_cast<size_t>(np));
  std::vector<std::unordered_map<int, bool>> events(static_cast<size_t>(np));
  std::vector<int64_t> live(static_cast<size_t>(np));
  size_t remaining = 0;
  for (int p = 0; p < np; ++p) {
    const Program& prog = plan.templates[static_cast<size_t>(p)];
    head[static_cast<size_t>(p)].assign(prog.streams.size(), 0);
    live[static_cast<size_t>(p)] = prog.static_bytes;
    stats.peak_bytes[static_cast<size_t>(p)] = prog.static_bytes;
    remaining += prog.num_instructions();
  }
  auto at = [&](const Loc& l) -> const Instruction* {
    const auto& instrs = plan.templates[static_cast<size_t>(l.prog)].streams[static_cast<size_t>(l.stream)].instrs;
    size_t h = head[static_cast<size_t>(l.prog)][static_cast<size_t>(l.stream)];
    return h == l.pos && h < instrs.size() ? &instrs[h] : nullptr;
  };
  auto complete = [&](int p, int s) {
    const Program& prog = plan.templates[static_cast<size_t>(p)];
    const Instruction& in =
        prog.streams[static_cast<size_t>(s)].instrs[head[static_cast<size_t>(p)][static_cast<size_t>(s)]];
    if (in.op == OpKind::kRecord) events[static_cast<size_t>(p)][in.event] = true;
    live[static_cast<size_t>(p)] += in.mem_delta;
    auto& peak = stats.peak_bytes[static_cast<size_t>(p)];
    peak = std::max(peak, live[static_cast<size_t>(p)]);
    ++head[static_cast<size_t>(p)][static_cast<size_t>(s)];
    --remaining;
  };
  bool progress = true;
  while (remaining > 0 && progress) {
    progress = false;
    for (int p = 0; p < np; ++p) {
      const Program& prog = plan.templates[static_cast<size_t>(p)];
      for (int s = 0; s < static_cast<int>(prog.streams.size()); ++s) {
        const auto& instrs = prog.streams[static_cast<size_t>(s)].instrs;
        while (head[static_cast<size_t>(p)][static_cast<size_t>(s)] < instrs.size()) {
          size_t h = head[static_cast<size_t>(p)][static_cast<size_t>(s)];
          const Instruction& in = instrs[h];
          if (in.op == OpKind::kWait) {
            if (!events[static_cast<size_t>(p)].count(in.event)) break;
          } else if (in.op == OpKind::kSend || in.op == OpKind::kRecv) {
            const bool send = in.op == OpKind::kSend;
            const Loc& other = send ? recvs[key(p, in.tag)] : sends[key(in.peer, in.tag)];
            if (at(other) == nullptr) break;
            complete(other.prog, other.stream);
          }
          complete(p, s);
          progress = true;
        }
      }
    }
  }
  if (remaining > 0) {
    std::string msg = "deadlock under blocking point-to-point semantics:";
    int shown = 0;
    for (int p = 0; p < np && shown < 8; ++p) {
      const Program& prog = plan.templates[static_cast<size_t>(p)];
      for (int s = 0; s < static_cast<int>(prog.streams.size()) && shown < 8; ++s) {
        size_t h = head[static_cast<size_t>(p)][static_cast<size_t>(s)];
        if (h >= prog.streams[static_cast<size_t>(s)].instrs.size()) continue;
        msg += " " + where(plan, p, s, h) + " is blocked;";
        ++shown;
      }
    }
    msg.pop_back();
    return failed_precondition(msg);
  }
  if (capacity > 0) {
    for (int p = 0; p < np; ++p) {
      if (stats.peak_bytes[static_cast<size_t>(p)] > capacity) {
        return resource_exhausted(
            "rank " + std::to_string(p) + " needs " + std::to_string(stats.peak_bytes[static_cast<size_t>(p)] >> 20) +
            " MiB at its peak but "
            "the device has " +
            std::to_string(capacity >> 20) + " MiB; raise pp/ep/zero, add recompute, or lower microbatch size");
      }
    }
  }
  return stats;
}

}  // namespace piper::compile
