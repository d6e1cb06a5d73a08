#include "piper/ir/directive.h"

#include <cctype>

#include "piper/base/strings.h"
#include "piper/spec/activation_counting.h"
#include "piper/spec/limits.h"

namespace piper::ir {
namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

Result<TagFilter> read_filter(JsonReader& r, const std::string& key, bool required) {
  const Json* v = r.find(key);
  if (v == nullptr) {
    if (required) return invalid_argument(r.field_path(key) + ": required tag filter is missing (use {} for all)");
    return TagFilter{};
  }
  return TagFilter::from_json(*v, r.field_path(key));
}

Result<TagFilter> read_slot_member(const Json& j, const std::string& what) {
  if (j.is_string()) return parse_action_filter(j.get<std::string>(), -1, what);
  return TagFilter::from_json(j, what);
}

Result<OrderDirective> read_order(JsonReader& r) {
  OrderDirective d;
  PIPER_RETURN_IF_ERROR(r.get_int("rank", &d.rank, true, 0, kMaxWorldSize));
  PIPER_RETURN_IF_ERROR(r.get_string("stream", &d.stream, false));
  const Json* slots = r.find("slots");
  if (slots == nullptr || !slots->is_array()) {
    return invalid_argument(r.field_path("slots") + ": required list of slots is missing, e.g. [\"0F0\", \"0F1\"]");
  }
  for (size_t i = 0; i < slots->size(); ++i) {
    const Json& s = (*slots)[i];
    std::string what = r.field_path("slots") + "[" + std::to_string(i) + "]";
    std::vector<TagFilter> slot;
    if (s.is_array()) {
      if (s.empty()) return invalid_argument(what + ": an empty slot; remove it or list at least one filter");
      for (size_t k = 0; k < s.size(); ++k) {
        PIPER_ASSIGN_OR_RETURN(TagFilter f, read_slot_member(s[k], what + "[" + std::to_string(k) + "]"));
        slot.push_back(f);
      }
    } else {
      PIPER_ASSIGN_OR_RETURN(TagFilter f, read_slot_member(s, what));
      slot.push_back(f);
    }
    d.slots.push_back(std::move(slot));
  }
  return d;
}

Result<DirectiveBody> read_body(const std::string& kind, JsonReader& r) {
  if (kind == "split") {
    SplitDirective d;
    // Bounded where it enters: split clones the graph once per microbatch (apply_split bounds the node count).
    PIPER_RETURN_IF_ERROR(r.get_int("microbatches", &d.microbatches, true, 1, kMaxMicrobatches));
    return DirectiveBody{d};
  }
  if (kind == "place") {
    PlaceDirective d;
    PIPER_ASSIGN_OR_RETURN(d.filter, read_filter(r, "filter", true));
    PIPER_RETURN_IF_ERROR(r.get_int("stage", &d.stage, false, 0, kMaxWorldSize * kMaxVpp));
    PIPER_RETURN_IF_ERROR(r.get_int("rank", &d.rank, false, 0, kMaxWorldSize));
    if (d.stage < 0 && d.rank < 0) {
      return invalid_argument(
          "place needs \"stage\" (tag the nodes with a pipeline stage) or \"rank\" (put them on "
          "a pipeline rank), or both");
    }
    return DirectiveBody{d};
  }
  if (kind == "replicate") {
    ReplicateDirective d;
    PIPER_ASSIGN_OR_RETURN(d.filter, read_filter(r, "filter", false));
    PIPER_RETURN_IF_ERROR(r.get_enum("axis", &d.axis, {"dp", "edp"}, false));
    PIPER_RETURN_IF_ERROR(r.get_int("zero", &d.zero, false, 0, 3));
    PIPER_RETURN_IF_ERROR(r.get_enum("reduce", &d.reduce, {"all_reduce", "reduce_scatter"}, false));
    PIPER_RETURN_IF_ERROR(r.get_double("bucket_mb", &d.bucket_mb, false, 0, 1e9));
    PIPER_RETURN_IF_ERROR(r.get_string("stream", &d.stream, false));
    PIPER_RETURN_IF_ERROR(r.get_enum("param_gather", &d.param_gather, {"after_update", "before_forward"}, false));
    if (d.zero >= 1) d.reduce = "reduce_scatter";
    return DirectiveBody{d};
  }
  if (kind == "shard") {
    ShardDirective d;
    PIPER_ASSIGN_OR_RETURN(d.filter, read_filter(r, "filter", true));
    PIPER_RETURN_IF_ERROR(r.get_enum("axis", &d.axis, {"ep", "tp"}, true));
    PIPER_RETURN_IF_ERROR(r.get_enum("algorithm", &d.algorithm, {"flat", "halo", "ring"}, false));
    PIPER_RETURN_IF_ERROR(r.get_bool("sequence_parallel", &d.sequence_parallel, false));
    PIPER_RETURN_IF_ERROR(r.get_string("stream", &d.stream, false));
    return DirectiveBody{d};
  }
  if (kind == "order") {
    PIPER_ASSIGN_OR_RETURN(OrderDirective d, read_order(r));
    return DirectiveBody{d};
  }
  if (kind == "stream") {
    StreamDirective d;
    PIPER_ASSIGN_OR_RETURN(d.filter, read_filter(r, "filter", true));
    PIPER_RETURN_IF_ERROR(r.get_string("stream", &d.stream, true));
    if (d.stream.empty()) return invalid_argument(r.field_path("stream") + ": stream name is empty");
    return DirectiveBody{d};
  }
  if (kind == "recompute") {
    RecomputeDirective d;
    PIPER_ASSIGN_OR_RETURN(d.filter, read_filter(r, "filter", true));
    std::string modules;
    PIPER_RETURN_IF_ERROR(r.get_string("modules", &modules, false));
    for (const std::string& raw : split(modules, '+')) {
      const std::string m = trim(raw);
      if (m.empty()) continue;
      if (!is_recompute_module(m)) {
        return invalid_argument(r.field_path("modules") + ": unknown module '" + m +
                                "'; known: layernorm, moe_act (leave modules out to re-run whole chunks)");
      }
      d.modules.push_back(m);
    }
    return DirectiveBody{d};
  }
  if (kind == "disaggregate") {
    DisaggregateDirective d;
    PIPER_RETURN_IF_ERROR(r.get_int("attn_groups", &d.attn_groups, true, 1, kMaxWorldSize));
    PIPER_RETURN_IF_ERROR(r.get_int("ffn_groups", &d.ffn_groups, true, 1, kMaxWorldSize));
    PIPER_RETURN_IF_ERROR(r.get_int("attn_ports", &d.attn_ports, false, 0, kMaxWorldSize));
    PIPER_RETURN_IF_ERROR(r.get_int("ffn_ports", &d.ffn_ports, false, 0, kMaxWorldSize));
    return DirectiveBody{d};
  }
  std::string hint = closest_match(kind, directive_names());
  return invalid_argument("unknown directive '" + kind + "'" + (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                          " (known: " + join(directive_names(), ", ") + ")");
}

}  // namespace

std::vector<std::string> directive_names() {
  return {"split", "place", "replicate", "shard", "order", "stream", "recompute", "disaggregate"};
}

const char* Directive::name() const {
  return std::visit(
      Overloaded{[](const SplitDirective&) { return "split"; }, [](const PlaceDirective&) { return "place"; },
                 [](const ReplicateDirective&) { return "replicate"; }, [](const ShardDirective&) { return "shard"; },
                 [](const OrderDirective&) { return "order"; }, [](const StreamDirective&) { return "stream"; },
                 [](const RecomputeDirective&) { return "recompute"; },
                 [](const DisaggregateDirective&) { return "disaggregate"; }},
      body);
}

Json Directive::to_json() const {
  Json j = Json::object();
  j["directive"] = name();
  std::visit(Overloaded{[&](const SplitDirective& d) { j["microbatches"] = d.microbatches; },
                        [&](const PlaceDirective& d) {
                          j["filter"] = d.filter.to_json();
                          if (d.stage >= 0) j["stage"] = d.stage;
                          if (d.rank >= 0) j["rank"] = d.rank;
                        },
                        [&](const ReplicateDirective& d) {
                          j["filter"] = d.filter.to_json();
                          j["axis"] = d.axis;
                          j["zero"] = d.zero;
                          j["reduce"] = d.reduce;
                          j["bucket_mb"] = d.bucket_mb;
                          j["stream"] = d.stream;
                          j["param_gather"] = d.param_gather;
                        },
                        [&](const ShardDirective& d) {
                          j["filter"] = d.filter.to_json();
                          j["axis"] = d.axis;
                          j["algorithm"] = d.algorithm;
                          j["sequence_parallel"] = d.sequence_parallel;
                          if (!d.stream.empty()) j["stream"] = d.stream;
                        },
                        [&](const OrderDirective& d) {
                          j["rank"] = d.rank;
                          j["stream"] = d.stream;
                          Json slots = Json::array();
                          for (const auto& slot : d.slots) {
                            auto one = [](const TagFilter& f) -> Json {
                              std::string a = action_text(f, true);
                              if (!a.empty()) return a;
                              return f.to_json();
                            };
                            if (slot.size() == 1) {
                              slots.push_back(one(slot[0]));
                            } else {
                              Json group = Json::array();
                              for (const auto& f : slot) group.push_back(one(f));
                              slots.push_back(group);
                            }
                          }
                          j["slots"] = slots;
                        },
                        [&](const StreamDirective& d) {
                          j["filter"] = d.filter.to_json();
                          j["stream"] = d.stream;
                        },
                        [&](const RecomputeDirective& d) {
                          j["filter"] = d.filter.to_json();
                          if (!d.modules.empty()) j["modules"] = join(d.modules, "+");
                        },
                        [&](const DisaggregateDirective& d) {
                          j["attn_groups"] = d.attn_groups;
                          j["ffn_groups"] = d.ffn_groups;
                          if (d.attn_ports > 0 || d.ffn_ports > 0) {
                            j["attn_ports"] = d.attn_ports;
                            j["ffn_ports"] = d.ffn_ports;
                          }
                        }},
             body);
  return j;
}

Result<Directive> Directive::from_json(const Json& j, int index) {
  std::string label = "directive " + std::to_string(index);
  if (!j.is_object()) {
    return invalid_argument(label + ": expected an object such as {\"directive\": \"split\", \"microbatches\": 8}");
  }
  JsonReader r(j, "");
  std::string kind;
  Status s = r.get_string("directive", &kind, true);
  if (!s.ok()) return s.with_context(label);
  label += " (" + kind + ")";
  auto body = read_body(kind, r);
  if (!body.ok()) return body.status().with_context(label);
  s = r.check_no_unknown_keys();
  if (!s.ok()) return s.with_context(label);
  return Directive{std::move(body).value()};
}

Json directives_to_json(const std::vector<Directive>& directives) {
  Json list = Json::array();
  for (const auto& d : directives) list.push_back(d.to_json());
  return Json{{"directives", list}};
}

Result<std::vector<Directive>> directives_from_json(const Json& j, const std::string& what) {
  const Json* list = &j;
  if (j.is_object()) {
    if (!j.contains("directives") || j.size() != 1) {
      return invalid_argument(what + ": expected a list of directives or {\"directives\": [...]}");
    }
    list = &j["directives"];
  }
  if (!list->is_array()) return invalid_argument(what + ": \"directives\" must be a list");
  std::vector<Directive> out;
  for (size_t i = 0; i < list->size(); ++i) {
    auto d = Directive::from_json((*list)[i], static_cast<int>(i));
    if (!d.ok()) return d.status().with_context(what);
    out.push_back(std::move(d).value());
  }
  return out;
}

Result<std::vector<Directive>> load_directives_file(const std::string& path) {
  PIPER_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  PIPER_ASSIGN_OR_RETURN(Json j, parse_json(text, path));
  return directives_from_json(j, path);
}

std::string directive_label(const Directive& d, int index) {
  return "directive " + std::to_string(index) + " (" + d.name() + ")";
}

Result<TagFilter> parse_action_filter(const std::string& text, int default_stage, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  size_t p = i;
  while (p < text.size() && std::isalpha(static_cast<unsigned char>(text[p]))) ++p;
  auto bad = [&] {
    return invalid_argument(what + ": '" + text +
                            "' is not an action; write <stage><pass><mb> such as \"0F3\" or "
                            "\"7BW2\" (pass F, B, W or BW)");
  };
  if (p == i || p == text.size()) return bad();
  for (size_t k = p; k < text.size(); ++k) {
    if (!std::isdigit(static_cast<unsigned char>(text[k]))) return bad();
  }
  // Digits only, so std::stoi can fail only by overflow: more than 7 digits is past any stage or microbatch.
  constexpr size_t kMaxDigits = 7;
  if (i > kMaxDigits || text.size() - p > kMaxDigits) {
    return invalid_argument(what + ": '" + text + "' names a stage or microbatch above 9999999; no plan has one");
  }
  int stage = default_stage;
  if (i > 0) stage = std::stoi(text.substr(0, i));
  if (stage < 0) return bad();
  auto pass = parse_pass(text.substr(i, p - i), what);
  if (!pass.ok()) return pass.status();
  if (*pass == Pass::kU) return bad();
  return stage_filter(stage, std::stoi(text.substr(p)), *pass);
}

std::string action_text(const TagFilter& f, bool with_stage) {
  bool simple = f.layer.empty() && f.part.empty() && f.pass != Pass::kNone && !f.mb.empty() && f.mb.lo == f.mb.hi &&
                !f.stage.empty() && f.stage.lo == f.stage.hi;
  if (!simple) return "";
  return (with_stage ? std::to_string(f.stage.lo) : "") + to_string(f.pass) + std::to_string(f.mb.lo);
}

}  // namespace piper::ir
