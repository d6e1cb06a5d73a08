#include "piper/balance/expert_loads.h"

#include <algorithm>
#include <numeric>

#include "piper/base/files.h"
#include "piper/spec/limits.h"

namespace piper::balance {
namespace {

constexpr const char* kFormat = "piper-expert-loads";
constexpr int kVersion = 1;
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
  return j;
}

Status ExpertLoads::add_step(const std::vector<std::pair<int, std::vector<int64_t>>>& step) {
  if (layers.empty()) {
    for (const auto& [layer, tokens] : step) layers.push_back(LayerLoads{layer, std::vector<int64_t>(tokens.size())});
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
  PIPER_RETURN_IF_ERROR(r.get_int("version", &version, true, kVersion, kVersion));
  PIPER_RETURN_IF_ERROR(r.get_string("model", &loads.model, true));
  PIPER_RETURN_IF_ERROR(r.get_int("num_experts", &loads.num_experts, true, 1, static_cast<int>(kMaxExperts)));
  PIPER_RETURN_IF_ERROR(r.get_int("steps", &loads.steps, true, 1));
  const Json* layers = r.find("layers");
  if (layers == nullptr || !layers->is_array() || layers->empty() ||
      layers->size() > static_cast<size_t>(kMaxLayers)) {
    return bad(what, "layers must be an array of 1.." + std::to_string(kMaxLayers) + " MoE layers");
  }
  int64_t total = 0;
  for (size_t i = 0; i < layers->size(); ++i) {
    auto l = parse_layer((*layers)[i], "expert_loads.layers[" + std::to_string(i) + "]", loads.num_experts);
    if (!l.ok()) return bad(what, l.status().message());
    if (!loads.layers.empty() && l->layer <= loads.layers.back().layer) {
      return bad(what, "layers must be in increasing layer order (layer " + std::to_string(l->layer) + " after " +
                           std::to_string(loads.layers.back().layer) + ")");
    }
    for (int64_t t : l->tokens) total = std::min<int64_t>(total + t, INT64_MAX / 2);
    loads.layers.push_back(*std::move(l));
  }
  if (total == 0) return bad(what, "every token count is 0: nothing was routed");
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
  RankLoads out;
  out.ep = ep;
  for (const LayerLoads& l : loads.layers) {
    std::vector<double> rank(static_cast<size_t>(ep), 0.0);
    for (int e = 0; e < loads.num_experts; ++e) {
      rank[static_cast<size_t>(e / per)] += static_cast<double>(l.tokens[static_cast<size_t>(e)]);
    }
    const double mean = std::accumulate(rank.begin(), rank.end(), 0.0) / ep;
    for (double& r : rank) r = mean > 0 ? r / mean : 1.0;  // a layer that routed nothing: priced as balanced
    out.layers.push_back(l.layer);
    out.factor.push_back(std::move(rank));
  }
  return out;
}

double RankLoads::of(int layer, int r) const {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] == layer) return factor[i][static_cast<size_t>(r)];
  }
  return 1.0;
}

double RankLoads::busiest(int layer) const {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] == layer) return *std::max_element(factor[i].begin(), factor[i].end());
  }
  return 1.0;
}

Result<double> contiguous_imbalance(const ExpertLoads& loads, int ep) {
  PIPER_ASSIGN_OR_RETURN(RankLoads ranks, contiguous_rank_loads(loads, ep));
  double sum = 0;
  int counted = 0;
  for (const LayerLoads& l : loads.layers) {
    if (std::accumulate(l.tokens.begin(), l.tokens.end(), int64_t{0}) <= 0) continue;  // routed nothing: prices nothing
    sum += ranks.busiest(l.layer);
    ++counted;
  }
  return counted > 0 ? sum / counted : 1.0;
}

}  // namespace piper::balance
