#include "piper/balance/expert_loads.h"

#include <algorithm>
#include <numeric>

#include "piper/base/files.h"
#include "piper/spec/limits.h"

namespace piper::balance {
namespace {

constexpr const char* kFormat = "piper-expert-loads";
constexpr int kVersion = 2;  // 2: busiest_steps and step_tokens; version 1 files (without) still read
constexpr const char* kFix = " (a file written by `piper train --record-expert-loads`)";

Status bad(const std::string& what, const std::string& problem) { return invalid_argument(what + ": " + problem + kFix); }

Result<LayerLoads> parse_layer(const Json& j, const std::string& path, int num_experts) {
  if (!j.is_object()) return invalid_argument(path + " must be an object {\"layer\": L, \"tokens\": [...]}");
  JsonReader r(j, path);
  LayerLoads l;
  PIPER_RETURN_IF_ERROR(r.get_int("layer", &l.layer, true, 0, static_cast<int>(kMaxLayers) - 1));
  const Json* tokens = r.find("tokens");
  if (tokens == nullptr || !tokens->is_array() || static_cast<int>(tokens->size()) != num_experts) {
    return invalid_argument(path + ".tokens must be an array of num_experts (" + std::to_string(num_experts) +
                            ") token counts");
  }
  for (size_t e = 0; e < tokens->size(); ++e) {
    const Json& v = (*tokens)[e];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return invalid_argument(path + ".tokens[" + std::to_string(e) + "] must be a non-negative integer");
    }
    l.tokens.push_back(v.get<int64_t>());
  }
  PIPER_RETURN_IF_ERROR(r.check_no_unknown_keys());
  return l;
}

// One ep rank's busiest step: {"step": S, "tokens": [rows per MoE layer]}, S in [1, steps], each count at most its
// layer's total over the run.
Result<BusiestStep> parse_busiest_rank(const Json& j, const std::string& path, const ExpertLoads& loads) {
  if (!j.is_object()) return invalid_argument(path + " must be an object {\"step\": S, \"tokens\": [...]}");
  JsonReader r(j, path);
  BusiestStep b;
  PIPER_RETURN_IF_ERROR(r.get_int("step", &b.step, true, 1, loads.steps));
  const Json* tokens = r.find("tokens");
  if (tokens == nullptr || !tokens->is_array() || tokens->size() != loads.layers.size()) {
    return invalid_argument(path + ".tokens must be an array of the rank's rows in each of the " +
                            std::to_string(loads.layers.size()) + " layers");
  }
  for (size_t i = 0; i < tokens->size(); ++i) {
    const Json& v = (*tokens)[i];
    const double total = std::accumulate(loads.layers[i].tokens.begin(), loads.layers[i].tokens.end(), 0.0);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || static_cast<double>(v.get<int64_t>()) > total) {
      return invalid_argument(path + ".tokens[" + std::to_string(i) + "] must be a non-negative integer, at most " +
                              "the layer's rows over the whole run");
    }
    b.tokens.push_back(v.get<int64_t>());
  }
  PIPER_RETURN_IF_ERROR(r.check_no_unknown_keys());
  return b;
}

// Whether ep rank `r`'s busiest step holds at least its mean step: summed over the routed layers, each layer's rows
// over the layer's rows in the run, that step times the steps against the run (a recorded file: every step routes
// as many rows per layer, so this is its rows against the run's over the steps). What keeps the memory load >= 1.
bool holds_its_mean_step(const ExpertLoads& loads, int ep, int r, const BusiestStep& s) {
  const int per = loads.num_experts / ep;
  double busiest = 0, mean = 0;
  for (size_t i = 0; i < loads.layers.size(); ++i) {
    const std::vector<int64_t>& t = loads.layers[i].tokens;
    const double total = std::accumulate(t.begin(), t.end(), 0.0);
    if (total <= 0) continue;
    const auto first = t.begin() + static_cast<std::ptrdiff_t>(r) * per;
    mean += std::accumulate(first, first + per, 0.0) / total;
    busiest += static_cast<double>(s.tokens[i]) * static_cast<double>(loads.steps) / total;
  }
  return busiest >= mean * (1 - 1e-9);
}

// {"ep": N, "ranks": [...]}: N divides num_experts, 2 <= N <= kMaxRecordedEp, larger than the entry before.
Result<BusiestSteps> parse_busiest(const Json& j, const std::string& path, const ExpertLoads& loads, int after_ep) {
  if (!j.is_object()) return invalid_argument(path + " must be an object {\"ep\": N, \"ranks\": [...]}");
  JsonReader r(j, path);
  BusiestSteps b;
  PIPER_RETURN_IF_ERROR(r.get_int("ep", &b.ep, true, 2, std::min(loads.num_experts, kMaxRecordedEp)));
  if (loads.num_experts % b.ep != 0 || b.ep <= after_ep) {
    return invalid_argument(path + ".ep = " + std::to_string(b.ep) + " must divide num_experts (" +
                            std::to_string(loads.num_experts) + ") and follow ep " + std::to_string(after_ep));
  }
  const Json* ranks = r.find("ranks");
  if (ranks == nullptr || !ranks->is_array() || ranks->size() != static_cast<size_t>(b.ep)) {
    return invalid_argument(path + ".ranks must be an array of ep (" + std::to_string(b.ep) + ") busiest steps");
  }
  for (size_t k = 0; k < ranks->size(); ++k) {
    const std::string at = path + ".ranks[" + std::to_string(k) + "]";
    PIPER_ASSIGN_OR_RETURN(BusiestStep s, parse_busiest_rank((*ranks)[k], at, loads));
    if (!holds_its_mean_step(loads, b.ep, static_cast<int>(k), s)) {
      return invalid_argument(at + " holds fewer rows than the rank's mean step (its rows over the run divided by " +
                              std::to_string(loads.steps) + " steps, each layer's over the layer's rows): not its "
                              "busiest step");
    }
    b.ranks.push_back(std::move(s));
  }
  PIPER_RETURN_IF_ERROR(r.check_no_unknown_keys());
  return b;
}

Status parse_busiest_steps(const Json& j, ExpertLoads* loads) {
  if (!j.is_array()) return invalid_argument("expert_loads.busiest_steps must be an array");
  for (size_t i = 0; i < j.size(); ++i) {
    const int after = loads->busiest.empty() ? 1 : loads->busiest.back().ep;
    PIPER_ASSIGN_OR_RETURN(BusiestSteps b,
                           parse_busiest(j[i], "expert_loads.busiest_steps[" + std::to_string(i) + "]", *loads, after));
    loads->busiest.push_back(std::move(b));
  }
  return ok_status();
}

// "step_tokens": `steps` entries of one array per layer of num_experts counts, within kMaxStepTokens, summing to
// the layers' tokens exactly.
Status parse_step_tokens(const Json& j, ExpertLoads* loads) {
  const std::string path = "expert_loads.step_tokens";
  const int64_t layers = static_cast<int64_t>(loads->layers.size()), experts = loads->num_experts;
  if (!j.is_array() || static_cast<int64_t>(j.size()) != loads->steps) {
    return invalid_argument(path + " must be an array of steps (" + std::to_string(loads->steps) + ") entries");
  }
  if (loads->steps > kMaxStepTokens / (layers * experts)) {
    return invalid_argument(path + ": " + std::to_string(loads->steps) + " steps x " + std::to_string(layers) +
                            " layers x " + std::to_string(experts) + " experts is more than the " +
                            std::to_string(kMaxStepTokens) + " counts a file keeps");
  }
  std::vector<std::vector<int64_t>> sum(static_cast<size_t>(layers), std::vector<int64_t>(experts, 0));
  for (size_t s = 0; s < j.size(); ++s) {
    const std::string at = path + "[" + std::to_string(s) + "]";
    if (!j[s].is_array() || static_cast<int64_t>(j[s].size()) != layers) {
      return invalid_argument(at + " must be an array of the " + std::to_string(layers) + " layers' counts");
    }
    std::vector<std::vector<int64_t>> step;
    for (size_t i = 0; i < j[s].size(); ++i) {
      const Json& row = j[s][i];
      if (!row.is_array() || static_cast<int64_t>(row.size()) != experts) {
        return invalid_argument(at + "[" + std::to_string(i) + "] must be an array of num_experts counts");
      }
      std::vector<int64_t> counts;
      for (size_t e = 0; e < row.size(); ++e) {
        const int64_t left = loads->layers[i].tokens[e] - sum[i][e];
        if (!row[e].is_number_integer() || row[e].get<int64_t>() < 0 || row[e].get<int64_t>() > left) {
          return invalid_argument(at + "[" + std::to_string(i) + "][" + std::to_string(e) +
                                  "] must be a non-negative integer, the steps summing to layers[" +
                                  std::to_string(i) + "].tokens[" + std::to_string(e) + "]");
        }
        counts.push_back(row[e].get<int64_t>());
        sum[i][e] += counts.back();
      }
      step.push_back(std::move(counts));
    }
    loads->step_tokens.push_back(std::move(step));
  }
  for (size_t i = 0; i < sum.size(); ++i) {
    if (sum[i] != loads->layers[i].tokens) {
      return invalid_argument(path + ": the steps' counts of layer " + std::to_string(loads->layers[i].layer) +
                              " do not sum to its tokens");
    }
  }
  return ok_status();
}

// The expert-parallel degrees whose busiest steps a run records: every divisor of num_experts in [2, kMaxRecordedEp].
std::vector<BusiestSteps> recorded_eps(int num_experts) {
  std::vector<BusiestSteps> out;
  for (int ep = 2; ep <= std::min(num_experts, kMaxRecordedEp); ++ep) {
    if (num_experts % ep == 0) out.push_back(BusiestSteps{ep, std::vector<BusiestStep>(static_cast<size_t>(ep))});
  }
  return out;
}

// Keeps, per recorded ep rank, the step (number `step`) whose rows summed over the layers are the most.
void note_busiest(const std::vector<std::pair<int, std::vector<int64_t>>>& step_loads, int64_t step, int num_experts,
                  std::vector<BusiestSteps>* busiest) {
  for (BusiestSteps& b : *busiest) {
    const int per = num_experts / b.ep;
    for (int r = 0; r < b.ep; ++r) {
      std::vector<int64_t> rows;
      for (const auto& layer : step_loads) {
        const auto first = layer.second.begin() + static_cast<std::ptrdiff_t>(r) * per;
        rows.push_back(std::accumulate(first, first + per, int64_t{0}));
      }
      BusiestStep& kept = b.ranks[static_cast<size_t>(r)];
      const int64_t now = std::accumulate(rows.begin(), rows.end(), int64_t{0});
      if (kept.tokens.empty() || now > std::accumulate(kept.tokens.begin(), kept.tokens.end(), int64_t{0})) {
        kept = BusiestStep{step, std::move(rows)};
      }
    }
  }
}

// With step_tokens, each recorded busiest step must be the one they give (the first step with the most rows).
Status check_busiest_against_steps(const ExpertLoads& loads) {
  if (loads.step_tokens.empty()) return ok_status();
  for (const BusiestSteps& b : loads.busiest) {
    std::vector<BusiestSteps> again{BusiestSteps{b.ep, std::vector<BusiestStep>(static_cast<size_t>(b.ep))}};
    for (size_t s = 0; s < loads.step_tokens.size(); ++s) {
      std::vector<std::pair<int, std::vector<int64_t>>> step;
      for (size_t i = 0; i < loads.layers.size(); ++i) step.emplace_back(loads.layers[i].layer, loads.step_tokens[s][i]);
      note_busiest(step, static_cast<int64_t>(s) + 1, loads.num_experts, &again);
    }
    for (int r = 0; r < b.ep; ++r) {
      const BusiestStep& want = again[0].ranks[static_cast<size_t>(r)];
      const BusiestStep& got = b.ranks[static_cast<size_t>(r)];
      if (got.step != want.step || got.tokens != want.tokens) {
        return invalid_argument("expert_loads.busiest_steps: ep " + std::to_string(b.ep) + " rank " +
                                std::to_string(r) + " names step " + std::to_string(got.step) +
                                ", but step_tokens give step " + std::to_string(want.step));
      }
    }
  }
  return ok_status();
}

// RankLoads::step_factor: each step's rows of every ep rank over the mean rank's rows per step, per layer (a layer
// that routed nothing: 1).
std::vector<std::vector<std::vector<double>>> step_factors(const ExpertLoads& loads, int ep) {
  std::vector<std::vector<std::vector<double>>> out;
  const int per = loads.num_experts / ep;
  for (const auto& step : loads.step_tokens) {
    std::vector<std::vector<double>> layers;
    for (size_t i = 0; i < step.size(); ++i) {
      const std::vector<int64_t>& t = loads.layers[i].tokens;
      const double mean = std::accumulate(t.begin(), t.end(), 0.0) / static_cast<double>(loads.steps * ep);
      std::vector<double> rank(static_cast<size_t>(ep), 1.0);
      for (int r = 0; r < ep && mean > 0; ++r) {
        const auto first = step[i].begin() + static_cast<std::ptrdiff_t>(r) * per;
        rank[static_cast<size_t>(r)] = std::accumulate(first, first + per, 0.0) / mean;
      }
      layers.push_back(std::move(rank));
    }
    out.push_back(std::move(layers));
  }
  return out;
}

}  // namespace

Json ExpertLoads::to_json() const {
  Json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["model"] = model;
  j["num_experts"] = num_experts;
  j["steps"] = steps;
  j["layers"] = Json::array();
  for (const LayerLoads& l : layers) j["layers"].push_back({{"layer", l.layer}, {"tokens", l.tokens}});
  j["busiest_steps"] = Json::array();
  for (const BusiestSteps& b : busiest) {
    Json ranks = Json::array();
    for (const BusiestStep& r : b.ranks) ranks.push_back({{"step", r.step}, {"tokens", r.tokens}});
    j["busiest_steps"].push_back({{"ep", b.ep}, {"ranks", ranks}});
  }
  if (!step_tokens.empty()) j["step_tokens"] = step_tokens;
  return j;
}

Status ExpertLoads::add_step(const std::vector<std::pair<int, std::vector<int64_t>>>& step) {
  if (layers.empty()) {
    for (const auto& [layer, tokens] : step) layers.push_back(LayerLoads{layer, std::vector<int64_t>(tokens.size())});
    busiest = recorded_eps(num_experts);
  }
  if (step.size() != layers.size()) {
    return internal_error("expert loads: a step reported " + std::to_string(step.size()) + " MoE layers, the first " +
                          std::to_string(layers.size()));
  }
  for (size_t i = 0; i < step.size(); ++i) {
    if (step[i].first != layers[i].layer || static_cast<int>(step[i].second.size()) != num_experts) {
      return internal_error("expert loads: step layer " + std::to_string(step[i].first) + " does not match layer " +
                            std::to_string(layers[i].layer) + " of " + std::to_string(num_experts) + " experts");
    }
    for (size_t e = 0; e < step[i].second.size(); ++e) layers[i].tokens[e] += step[i].second[e];
  }
  ++steps;
  note_busiest(step, steps, num_experts, &busiest);
  const int64_t counts = static_cast<int64_t>(layers.size()) * num_experts;
  if (!step_tokens_dropped && steps <= kMaxStepTokens / std::max<int64_t>(1, counts)) {
    std::vector<std::vector<int64_t>> now;
    for (const auto& layer : step) now.push_back(layer.second);
    step_tokens.push_back(std::move(now));
  } else if (!step_tokens_dropped) {
    step_tokens.clear();  // too long a run to keep every step: busiest_steps only
    step_tokens_dropped = true;
  }
  return ok_status();
}

Result<ExpertLoads> parse_expert_loads(const std::string& text, const std::string& what) {
  PIPER_ASSIGN_OR_RETURN(Json j, parse_json(text, what));
  if (!j.is_object()) return bad(what, "expected a JSON object");
  JsonReader r(j, "expert_loads");
  std::string format;
  int version = 0;
  ExpertLoads loads;
  PIPER_RETURN_IF_ERROR(r.get_string("format", &format, true));
  if (format != kFormat) return bad(what, "format is '" + elide(format) + "', expected '" + kFormat + "'");
  PIPER_RETURN_IF_ERROR(r.get_int("version", &version, true, 1, kVersion));
  PIPER_RETURN_IF_ERROR(r.get_string("model", &loads.model, true));
  PIPER_RETURN_IF_ERROR(r.get_int("num_experts", &loads.num_experts, true, 1, static_cast<int>(kMaxExperts)));
  PIPER_RETURN_IF_ERROR(r.get_int("steps", &loads.steps, true, 1));
  const Json* layers = r.find("layers");
  if (layers == nullptr || !layers->is_array() || layers->empty() ||
      layers->size() > static_cast<size_t>(kMaxLayers)) {
    return bad(what, "layers must be an array of 1.." + std::to_string(kMaxLayers) + " MoE layers");
  }
  bool routed = false;
  for (size_t i = 0; i < layers->size(); ++i) {
    auto l = parse_layer((*layers)[i], "expert_loads.layers[" + std::to_string(i) + "]", loads.num_experts);
    if (!l.ok()) return bad(what, l.status().message());
    if (!loads.layers.empty() && l->layer <= loads.layers.back().layer) {
      return bad(what, "layers must be in increasing layer order (layer " + std::to_string(l->layer) + " after " +
                           std::to_string(loads.layers.back().layer) + ")");
    }
    int64_t total = 0;
    for (int64_t t : l->tokens) {
      if (t > kMaxLayerTokens - total) {
        return bad(what, "layer " + std::to_string(l->layer) + " counts more than 2^50 routings over the run");
      }
      total += t;
    }
    routed = routed || total > 0;
    loads.layers.push_back(*std::move(l));
  }
  if (!routed) return bad(what, "every token count is 0: nothing was routed");
  const Json* busiest = r.find("busiest_steps");
  if ((busiest != nullptr) != (version >= 2)) {
    return bad(what, version >= 2 ? "version 2 lists busiest_steps (an array, [] when no ep is recorded)"
                                  : "busiest_steps needs version 2");
  }
  if (busiest != nullptr) {
    if (Status s = parse_busiest_steps(*busiest, &loads); !s.ok()) return bad(what, s.message());
  }
  if (const Json* steps = r.find("step_tokens"); steps != nullptr) {
    if (version < 2) return bad(what, "step_tokens needs version 2");
    if (Status s = parse_step_tokens(*steps, &loads); !s.ok()) return bad(what, s.message());
    if (Status s = check_busiest_against_steps(loads); !s.ok()) return bad(what, s.message());
  }
  if (Status s = r.check_no_unknown_keys(); !s.ok()) return bad(what, s.message());
  return loads;
}

Result<ExpertLoads> load_expert_loads(const std::string& path) {
  PIPER_ASSIGN_OR_RETURN(std::string text, read_regular_file(path, "--expert-loads"));
  return parse_expert_loads(text, path);
}

Status save_expert_loads(const std::string& path, const ExpertLoads& loads) {
  return write_file_atomic(path, loads.to_json().dump(1) + "\n");
}

Result<RankLoads> contiguous_rank_loads(const ExpertLoads& loads, int ep) {
  if (ep < 1 || loads.num_experts % ep != 0) {
    return invalid_argument("expert loads: ep=" + std::to_string(ep) + " does not divide the file's " +
                            std::to_string(loads.num_experts) + " experts; use a strategy whose ep divides " +
                            std::to_string(loads.num_experts) + ", or loads recorded on a model with as many experts");
  }
  const int per = loads.num_experts / ep;
  const BusiestSteps* busiest = nullptr;
  for (const BusiestSteps& b : loads.busiest) busiest = b.ep == ep ? &b : busiest;
  RankLoads out;
  out.ep = ep;
  for (size_t i = 0; i < loads.layers.size(); ++i) {
    const LayerLoads& l = loads.layers[i];
    std::vector<double> rank(static_cast<size_t>(ep), 0.0);
    for (int e = 0; e < loads.num_experts; ++e) {
      rank[static_cast<size_t>(e / per)] += static_cast<double>(l.tokens[static_cast<size_t>(e)]);
    }
    const double mean = std::accumulate(rank.begin(), rank.end(), 0.0) / ep;
    for (double& r : rank) r = mean > 0 ? r / mean : 1.0;  // a layer that routed nothing: priced as balanced
    std::vector<double> peak = rank;
    if (busiest != nullptr && mean > 0) {  // over the mean rank's rows in one step
      for (int r = 0; r < ep; ++r) {
        peak[static_cast<size_t>(r)] =
            static_cast<double>(busiest->ranks[static_cast<size_t>(r)].tokens[i]) * static_cast<double>(loads.steps) /
            mean;
      }
    }
    out.layers.push_back(l.layer);
    out.factor.push_back(std::move(rank));
    out.peak.push_back(std::move(peak));
  }
  out.step_factor = step_factors(loads, ep);
  return out;
}

double RankLoads::of(int layer, int r) const {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] == layer) return factor[i][static_cast<size_t>(r)];
  }
  return 1.0;
}

double RankLoads::peak_of(int layer, int r) const {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] == layer) return (peak.empty() ? factor : peak)[i][static_cast<size_t>(r)];
  }
  return 1.0;
}

std::vector<double> RankLoads::peak_over(const std::vector<int>& held, int r) const {
  std::vector<int> index;  // held[k]'s position in layers, or -1
  for (int layer : held) {
    auto it = std::find(layers.begin(), layers.end(), layer);
    index.push_back(it == layers.end() ? -1 : static_cast<int>(it - layers.begin()));
  }
  std::vector<double> out;
  if (step_factor.empty()) {
    for (int layer : held) out.push_back(peak_of(layer, r));
    return out;
  }
  size_t best = 0;
  double most = -1;
  for (size_t s = 0; s < step_factor.size(); ++s) {
    double rows = 0;
    for (int i : index) rows += i >= 0 ? step_factor[s][static_cast<size_t>(i)][static_cast<size_t>(r)] : 0.0;
    if (rows > most) {
      most = rows;
      best = s;
    }
  }
  for (int i : index) {
    out.push_back(i >= 0 ? step_factor[best][static_cast<size_t>(i)][static_cast<size_t>(r)] : 1.0);
  }
  return out;
}

RankLoads RankLoads::at_step(size_t s) const {
  RankLoads out = *this;
  if (out.peak.empty()) out.peak = factor;  // peak_of's fallback, kept when factor changes
  out.factor = step_factor.at(s);
  return out;
}

double RankLoads::busiest(int layer) const {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] == layer) return *std::max_element(factor[i].begin(), factor[i].end());
  }
  return 1.0;
}

Result<double> contiguous_imbalance(const ExpertLoads& loads, int ep) {
  PIPER_ASSIGN_OR_RETURN(RankLoads ranks, contiguous_rank_loads(loads, ep));
  return contiguous_imbalance(loads, ranks);
}

double contiguous_imbalance(const ExpertLoads& loads, const RankLoads& ranks) {
  double sum = 0;
  int counted = 0;
  for (const LayerLoads& l : loads.layers) {
    if (std::accumulate(l.tokens.begin(), l.tokens.end(), 0.0) <= 0) continue;  // routed nothing: prices nothing
    sum += ranks.busiest(l.layer);
    ++counted;
  }
  return counted > 0 ? sum / counted : 1.0;
}

Result<double> contiguous_memory_load(const ExpertLoads& loads, int ep) {
  PIPER_ASSIGN_OR_RETURN(RankLoads ranks, contiguous_rank_loads(loads, ep));
  return contiguous_memory_load(loads, ranks);
}

double contiguous_memory_load(const ExpertLoads& loads, const RankLoads& ranks) {
  double most = 0.0;
  for (int r = 0; r < ranks.ep; ++r) {
    double sum = 0;
    int counted = 0;
    for (size_t i = 0; i < loads.layers.size(); ++i) {
      const std::vector<int64_t>& t = loads.layers[i].tokens;
      if (std::accumulate(t.begin(), t.end(), 0.0) <= 0) continue;  // routed nothing: holds nothing
      sum += ranks.peak_of(loads.layers[i].layer, r);
      ++counted;
    }
    if (counted == 0) return 1.0;
    most = std::max(most, sum / counted);
  }
  return most;
}

}  // namespace piper::balance
