// Strategy: compact-string and JSON forms. Validation lives in strategy_validate.cc.
#include "piper/strategy/strategy.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "piper/base/check.h"
#include "piper/base/strings.h"
#include "piper/spec/activation_counting.h"

namespace piper {
namespace {

const std::vector<std::string>& key_names() {
  static const std::vector<std::string> kKeys = {
      "dp",     "tp",         "pp",        "vpp",          "ep",         "etp",        "zero",
      "sp",     "recompute",  "schedule",  "microbatches", "mbs",        "a2a",        "order",
      "disagg", "attn_ranks", "ffn_ranks", "fold",         "tp_overlap", "ep_overlap", "recompute_modules",
      "attn_ports", "ffn_ports"};
  return kKeys;
}

const std::vector<std::string>& recompute_names() {
  static const std::vector<std::string> kNames = {"none", "selective", "full"};
  return kNames;
}

const std::vector<std::string>& a2a_names() {
  static const std::vector<std::string> kNames = {"flat", "halo"};
  return kNames;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best = closest_match(word, candidates);
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

Status bad_choice(const std::string& key, const std::string& value, const std::vector<std::string>& allowed) {
  return invalid_argument("strategy: " + key + "=" + value + " is not one of {" + join(allowed, ", ") + "}" +
                          did_you_mean(value, allowed));
}

Result<std::string> parse_choice(const std::string& key, const std::string& value,
                                 const std::vector<std::string>& allowed) {
  for (const auto& a : allowed) {
    if (value == a) return a;
  }
  return bad_choice(key, value, allowed);
}

const std::vector<std::string>& recompute_module_names() {
  static const std::vector<std::string> kNames(std::begin(kRecomputeModules), std::end(kRecomputeModules));
  return kNames;
}

// Megatron's other --recompute-modules, with what Piper offers instead.
const char* module_alternative(const std::string& name) {
  if (name == "core_attn")
    return "Piper's recompute=selective re-runs the whole attention chunk (projections and core)";
  if (name == "moe" || name == "mlp" || name == "shared_experts" || name == "mla_up_proj")
    return "Piper re-runs whole chunks only: recompute=full re-runs every chunk from its input";
  return nullptr;
}

Result<std::vector<std::string>> parse_modules(const std::string& value) {
  std::set<std::string> names;
  for (const std::string& raw : split(value, '+')) {
    const std::string m = trim(raw);
    if (m.empty() || m == "none") continue;
    if (const char* alt = module_alternative(m)) {
      return invalid_argument("strategy: recompute_modules=" + value + ": Megatron's module '" + m +
                              "' is not modelled; " + alt);
    }
    PIPER_ASSIGN_OR_RETURN(std::string known, parse_choice("recompute_modules", m, recompute_module_names()));
    names.insert(known);
  }
  return std::vector<std::string>(names.begin(), names.end());
}

Result<bool> parse_flag(const std::string& key, const std::string& value) {
  std::string v = to_lower(value);
  if (v == "1" || v == "true" || v == "on") return true;
  if (v == "0" || v == "false" || v == "off") return false;
  return invalid_argument("strategy: " + key + "=" + value + " must be 0 or 1 (also true/false, on/off)");
}

Result<int> parse_degree(const std::string& key, const std::string& value) {
  PIPER_ASSIGN_OR_RETURN(int64_t v, parse_int(value, "strategy key " + key));
  if (v < 0 || v > (1 << 24)) {
    return invalid_argument("strategy: " + key + "=" + value + " is out of range; use an integer in 0.." +
                            std::to_string(1 << 24));
  }
  return static_cast<int>(v);
}

// Sets one key from its text value; the single place that knows how each key is spelled and typed.
Status set_key(Strategy* s, const std::string& key, const std::string& value) {
  struct IntKey {
    const char* name;
    int Strategy::*field;
  };
  static const IntKey kIntKeys[] = {{"dp", &Strategy::dp},
                                    {"tp", &Strategy::tp},
                                    {"pp", &Strategy::pp},
                                    {"vpp", &Strategy::vpp},
                                    {"ep", &Strategy::ep},
                                    {"etp", &Strategy::etp},
                                    {"zero", &Strategy::zero},
                                    {"microbatches", &Strategy::microbatches},
                                    {"mbs", &Strategy::mbs},
                                    {"attn_ranks", &Strategy::attn_ranks},
                                    {"ffn_ranks", &Strategy::ffn_ranks},
                                    {"attn_ports", &Strategy::attn_ports},
                                    {"ffn_ports", &Strategy::ffn_ports}};
  for (const auto& k : kIntKeys) {
    if (key == k.name) {
      PIPER_ASSIGN_OR_RETURN(s->*(k.field), parse_degree(key, value));
      return ok_status();
    }
  }
  if (key == "sp") {
    PIPER_ASSIGN_OR_RETURN(s->sp, parse_flag(key, value));
  } else if (key == "fold") {
    PIPER_ASSIGN_OR_RETURN(s->fold, parse_flag(key, value));
  } else if (key == "tp_overlap") {
    PIPER_ASSIGN_OR_RETURN(s->tp_overlap, parse_flag(key, value));
  } else if (key == "ep_overlap") {
    PIPER_ASSIGN_OR_RETURN(s->ep_overlap, parse_flag(key, value));
  } else if (key == "recompute_modules") {
    PIPER_ASSIGN_OR_RETURN(s->recompute_modules, parse_modules(value));
  } else if (key == "disagg") {
    PIPER_ASSIGN_OR_RETURN(s->disaggregate, parse_flag(key, value));
  } else if (key == "recompute") {
    PIPER_ASSIGN_OR_RETURN(std::string r, parse_choice(key, value, recompute_names()));
    s->recompute = r == "none" ? Recompute::kNone : r == "selective" ? Recompute::kSelective : Recompute::kFull;
  } else if (key == "schedule") {
    PIPER_RETURN_IF_ERROR(parse_schedule(value).status());  // names the registered ones and the fix
    s->schedule = value;
  } else if (key == "a2a") {
    PIPER_ASSIGN_OR_RETURN(s->a2a, parse_choice(key, value, a2a_names()));
  } else if (key == "order") {
    s->order = split(value, '-');
  } else {
    return invalid_argument("strategy: unknown key '" + key + "'" + did_you_mean(key, key_names()) + "; keys are " +
                            join(key_names(), ", "));
  }
  return ok_status();
}

Result<Strategy> parse_compact(const std::string& text) {
  Strategy s;
  if (text.empty()) return s;  // every key has a default
  std::set<std::string> seen;
  for (const std::string& raw : split(text, ',')) {
    std::string item = trim(raw);
    if (item.empty()) {
      return invalid_argument("strategy: empty item in '" + text + "'; write key=value pairs separated by ','");
    }
    size_t eq = item.find('=');
    if (eq == std::string::npos) {
      return invalid_argument("strategy: expected key=value, got '" + item + "' (e.g. dp=8,pp=4)");
    }
    std::string key = trim(item.substr(0, eq));
    std::string value = trim(item.substr(eq + 1));
    if (!seen.insert(key).second) {
      return invalid_argument("strategy: key '" + key + "' is given twice in '" + text + "'; keep one");
    }
    if (value.empty()) return invalid_argument("strategy: key '" + key + "' has no value; write " + key + "=...");
    PIPER_RETURN_IF_ERROR(set_key(&s, key, value));
  }
  return s;
}

// JSON values are printed back to the compact spelling, so both forms share set_key and its messages.
Result<std::string> json_value_text(const std::string& key, const Json& v) {
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_boolean()) return std::string(v.get<bool>() ? "1" : "0");
  if (v.is_string()) return v.get<std::string>();
  // Lists: the mesh order ('-' in the compact form) and the recompute modules ('+').
  if ((key == "order" || key == "recompute_modules") && v.is_array()) {
    std::vector<std::string> items;
    for (const auto& a : v) {
      if (!a.is_string()) return invalid_argument("strategy." + key + ": expected an array of names, got " + v.dump());
      items.push_back(a.get<std::string>());
    }
    return join(items, key == "order" ? "-" : "+");
  }
  return invalid_argument("strategy." + key + ": expected an integer, boolean or string, got " + v.dump());
}

}  // namespace

bool Strategy::recomputes_module(const std::string& name) const {
  return std::find(recompute_modules.begin(), recompute_modules.end(), name) != recompute_modules.end();
}

std::vector<std::string> Strategy::order_without_unit_axes(const std::vector<std::string>& axes) const {
  std::vector<std::string> out;
  for (const std::string& a : axes) {
    const int n = a == "tp" ? tp : a == "ep" ? ep : a == "dp" ? dp / std::max(1, ep) : pp;
    if (n > 1) out.push_back(a);
  }
  return out;
}

std::vector<std::string> Strategy::folded_layout(const std::vector<std::string>& axes) const {
  std::vector<std::string> out;
  for (const std::string& a : axes) {
    if (a != "ep" && (a == "tp" ? tp : a == "dp" ? dp : pp) > 1) out.push_back(a);
  }
  return out;
}

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> kNames = {"1f1b", "gpipe", "interleaved", "zb-h1", "dualpipev", "af-pipe"};
  return kNames;
}

namespace {
std::set<std::string>& registered_schedule_names() {
  static std::set<std::string> names;
  return names;
}
}  // namespace

std::vector<std::string> known_schedule_names() {
  std::vector<std::string> out = schedule_names();
  for (const std::string& n : registered_schedule_names()) {
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
  return out;
}

void register_schedule_name(const std::string& name) { registered_schedule_names().insert(name); }

Result<ScheduleKind> parse_schedule(const std::string& name) {
  const auto& names = schedule_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (name == names[i]) return static_cast<ScheduleKind>(i);
  }
  if (registered_schedule_names().count(name) > 0) return ScheduleKind::kCustom;
  return invalid_argument(bad_choice("schedule", name, known_schedule_names()).message() +
                          "; pick one of them, or register a C++ schedule under that name "
                          "(schedules::register_schedule) before parsing");
}

const char* to_string(ScheduleKind k) {
  return k == ScheduleKind::kCustom ? "custom" : schedule_names()[static_cast<size_t>(k)].c_str();
}

ScheduleKind Strategy::schedule_kind() const {
  // Cheap path for the planner: compare against the fixed names without building a Status.
  const auto& names = schedule_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (schedule == names[i]) return static_cast<ScheduleKind>(i);
  }
  if (registered_schedule_names().count(schedule) > 0) return ScheduleKind::kCustom;
  PIPER_CHECK(false, "unknown schedule '", schedule, "' in a strategy that was not validated");
  return ScheduleKind::k1F1B;
}

std::string Strategy::to_string() const {
  std::string out;
  out.reserve(200);
  out += "dp=" + std::to_string(dp) + ",tp=" + std::to_string(tp) + ",pp=" + std::to_string(pp) +
         ",vpp=" + std::to_string(vpp) + ",ep=" + std::to_string(ep) + ",etp=" + std::to_string(etp) +
         ",zero=" + std::to_string(zero) + ",sp=" + (sp ? "1" : "0") + ",recompute=" + piper::to_string(recompute) +
         ",schedule=" + schedule + ",microbatches=" + std::to_string(microbatches) + ",mbs=" + std::to_string(mbs) +
         ",a2a=" + a2a + ",order=" + join(order, "-");
  if (disaggregate) {
    out += ",disagg=1,attn_ranks=" + std::to_string(attn_ranks) + ",ffn_ranks=" + std::to_string(ffn_ranks);
    if (attn_ports > 0 || ffn_ports > 0) {
      out += ",attn_ports=" + std::to_string(attn_ports) + ",ffn_ports=" + std::to_string(ffn_ports);
    }
  }
  if (fold) out += ",fold=1";
  if (tp_overlap) out += ",tp_overlap=1";
  if (ep_overlap) out += ",ep_overlap=1";
  if (!recompute_modules.empty()) out += ",recompute_modules=" + join(recompute_modules, "+");
  return out;
}

Json Strategy::to_json() const {
  Json j = {{"dp", dp},
            {"tp", tp},
            {"pp", pp},
            {"vpp", vpp},
            {"ep", ep},
            {"etp", etp},
            {"zero", zero},
            {"sp", sp},
            {"recompute", piper::to_string(recompute)},
            {"schedule", schedule},
            {"microbatches", microbatches},
            {"mbs", mbs},
            {"a2a", a2a},
            {"order", order},
            {"disagg", disaggregate},
            {"attn_ranks", attn_ranks},
            {"ffn_ranks", ffn_ranks},
            {"fold", fold},
            {"tp_overlap", tp_overlap},
            {"ep_overlap", ep_overlap}};
  if (!recompute_modules.empty()) j["recompute_modules"] = join(recompute_modules, "+");
  if (attn_ports > 0 || ffn_ports > 0) {
    j["attn_ports"] = attn_ports;
    j["ffn_ports"] = ffn_ports;
  }
  return j;
}

Result<Strategy> Strategy::from_json(const Json& json) {
  if (!json.is_object()) return invalid_argument("strategy: expected a JSON object, got " + json.dump());
  Strategy s;
  for (auto it = json.begin(); it != json.end(); ++it) {
    PIPER_ASSIGN_OR_RETURN(std::string text, json_value_text(it.key(), it.value()));
    PIPER_RETURN_IF_ERROR(set_key(&s, it.key(), text));
  }
  return s;
}

Result<Strategy> Strategy::parse(const std::string& text) {
  std::string t = trim(text);
  if (starts_with(t, "{")) {
    PIPER_ASSIGN_OR_RETURN(Json j, parse_json(t, "--strategy"));
    return from_json(j);
  }
  std::error_code ec;
  if (ends_with(t, ".json") || (t.find('=') == std::string::npos && !t.empty() && std::filesystem::exists(t, ec))) {
    PIPER_ASSIGN_OR_RETURN(Json j, load_json_file(t));
    auto s = from_json(j);
    if (!s.ok()) return s.status().with_context(t);
    return s;
  }
  return parse_compact(t);
}

int Strategy::chunks_per_rank() const {
  if (schedule == "interleaved") return vpp;
  if (schedule == "dualpipev") return 2;
  if (registered_schedule_names().count(schedule) > 0) return vpp;  // the registered generator's ScheduleParams::vpp
  return 1;
}

std::pair<int, int> stage_layers(int num_layers, int num_stages, int stage) {
  const int base = num_layers / num_stages, extra = num_layers % num_stages;
  const int lo = stage * base + std::min(stage, extra);
  return {lo, lo + base + (stage < extra ? 1 : 0)};
}

}  // namespace piper
