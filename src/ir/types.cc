#include "piper/ir/types.h"

#include "piper/base/strings.h"

namespace piper::ir {

std::string task_key(Part part, Pass pass) { return std::string(chunk_name(part)) + "." + to_string(pass); }

const char* to_string(Pass p) {
  switch (p) {
    case Pass::kNone: return "-";
    case Pass::kF: return "F";
    case Pass::kB: return "B";
    case Pass::kW: return "W";
    case Pass::kBW: return "BW";
    case Pass::kU: return "U";
  }
  return "?";
}

Result<Pass> parse_pass(const std::string& text, const std::string& what) {
  if (text == "F") return Pass::kF;
  if (text == "B") return Pass::kB;
  if (text == "W") return Pass::kW;
  if (text == "BW") return Pass::kBW;
  if (text == "U") return Pass::kU;
  return invalid_argument(what + ": unknown pass '" + text +
                          "'; pick one of F (forward), B (input grad), W (weight grad), BW (fused backward), "
                          "U (update)");
}

const char* to_string(NodeKind k) {
  switch (k) {
    case NodeKind::kChunk: return "chunk";
    case NodeKind::kSend: return "send";
    case NodeKind::kRecv: return "recv";
    case NodeKind::kAllReduce: return "all_reduce";
    case NodeKind::kReduceScatter: return "reduce_scatter";
    case NodeKind::kAllGather: return "all_gather";
    case NodeKind::kAllToAll: return "all_to_all";
    case NodeKind::kM2N: return "m2n";
    case NodeKind::kUpdate: return "update";
  }
  return "?";
}

bool is_collective(NodeKind k) {
  return k == NodeKind::kAllReduce || k == NodeKind::kReduceScatter || k == NodeKind::kAllGather ||
         k == NodeKind::kAllToAll || k == NodeKind::kM2N;
}

bool is_comm(NodeKind k) { return is_collective(k) || k == NodeKind::kSend || k == NodeKind::kRecv; }

Result<IntRange> parse_range(const Json& value, const std::string& what) {
  // Indices beyond any layer, stage or microbatch count are refused before narrowing to int (2^32 must not wrap
  // to 0); the passes check ranges against the graph (check_filter_ranges).
  constexpr int64_t kMaxIndex = int64_t{1} << 24;
  auto index = [&](int64_t v, const std::string& text) -> Result<int> {
    if (v < 0) return invalid_argument(what + ": " + text + " is negative; use an index >= 0");
    if (v > kMaxIndex) {
      return invalid_argument(what + ": " + text + " is out of range; allowed 0.." + std::to_string(kMaxIndex) +
                              " (no layer, stage or microbatch index is larger)");
    }
    return static_cast<int>(v);
  };
  if (value.is_number_integer()) {
    int64_t v = value.is_number_unsigned() && value.get<uint64_t>() > INT64_MAX ? INT64_MAX : value.get<int64_t>();
    PIPER_ASSIGN_OR_RETURN(int i, index(v, value.dump()));
    return IntRange::single(i);
  }
  if (!value.is_string()) {
    return invalid_argument(what + ": expected an integer or a range string such as \"0-7\", got " +
                            std::string(value.type_name()));
  }
  std::string text = value.get<std::string>();
  auto parts = split(text, '-');
  if (parts.size() == 1) {
    PIPER_ASSIGN_OR_RETURN(int64_t v, parse_int(trim(parts[0]), what));
    PIPER_ASSIGN_OR_RETURN(int i, index(v, text));
    return IntRange::single(i);
  }
  if (parts.size() != 2)
    return invalid_argument(what + ": '" + text + "' is not a range; write \"lo-hi\", e.g. \"0-7\"");
  PIPER_ASSIGN_OR_RETURN(int64_t lo, parse_int(trim(parts[0]), what));
  PIPER_ASSIGN_OR_RETURN(int64_t hi, parse_int(trim(parts[1]), what));
  if (lo > hi) return invalid_argument(what + ": range '" + text + "' is empty; write it as \"lo-hi\" with lo <= hi");
  PIPER_ASSIGN_OR_RETURN(int lo_index, index(lo, text));
  PIPER_ASSIGN_OR_RETURN(int hi_index, index(hi, text));
  return IntRange{lo_index, hi_index};
}

Json range_to_json(const IntRange& r) {
  if (r.lo == r.hi) return r.lo;
  return std::to_string(r.lo) + "-" + std::to_string(r.hi);
}

bool TagFilter::matches(const Tags& t) const {
  if (!layer.empty() && !layer.contains(t.layer)) return false;
  if (!stage.empty() && !stage.contains(t.stage)) return false;
  if (!mb.empty() && !mb.contains(t.mb)) return false;
  if (!part.empty() && part != t.part) return false;
  if (pass != Pass::kNone && pass != t.pass) return false;
  return true;
}

Json TagFilter::to_json() const {
  Json j = Json::object();
  if (!layer.empty()) j["layer"] = range_to_json(layer);
  if (!stage.empty()) j["stage"] = range_to_json(stage);
  if (!mb.empty()) j["mb"] = range_to_json(mb);
  if (!part.empty()) j["part"] = part;
  if (pass != Pass::kNone) j["pass"] = ir::to_string(pass);
  return j;
}

Result<TagFilter> TagFilter::from_json(const Json& j, const std::string& what) {
  if (!j.is_object()) {
    return invalid_argument(what + ": a tag filter must be an object such as {\"stage\": 0, \"mb\": 1, \"pass\": \"F\"}");
  }
  TagFilter f;
  JsonReader reader(j, what);
  if (const Json* v = reader.find("layer")) {
    PIPER_ASSIGN_OR_RETURN(f.layer, parse_range(*v, reader.field_path("layer")));
  }
  if (const Json* v = reader.find("stage")) {
    PIPER_ASSIGN_OR_RETURN(f.stage, parse_range(*v, reader.field_path("stage")));
  }
  if (const Json* v = reader.find("mb")) {
    PIPER_ASSIGN_OR_RETURN(f.mb, parse_range(*v, reader.field_path("mb")));
  }
  PIPER_RETURN_IF_ERROR(reader.get_string("part", &f.part, false));
  std::string pass;
  PIPER_RETURN_IF_ERROR(reader.get_string("pass", &pass, false));
  if (!pass.empty()) {
    PIPER_ASSIGN_OR_RETURN(f.pass, parse_pass(pass, reader.field_path("pass")));
  }
  PIPER_RETURN_IF_ERROR(reader.check_no_unknown_keys());
  return f;
}

std::string TagFilter::to_string() const {
  std::string s = to_json().dump();
  return s;
}

TagFilter stage_filter(int stage, int mb, Pass pass) {
  TagFilter f;
  f.stage = IntRange::single(stage);
  f.mb = IntRange::single(mb);
  f.pass = pass;
  return f;
}

}  // namespace piper::ir
