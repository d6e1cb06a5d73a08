#include "piper/cost/device_model.h"

#include <algorithm>

namespace piper::cost {

namespace {

// "thread_figures": [{"threads": t, "peak_flops_fp32": ..., "gemm_half_dim": ..., "memory_bw_bytes_per_s": ...,
// "task_overhead_s": ...}, ...], ascending t.
Status read_thread_figures(JsonReader& r, std::vector<Calibration::ThreadFigures>* out) {
  const Json* list = r.find("thread_figures");
  if (list == nullptr) return ok_status();
  const std::string what = r.field_path("thread_figures");
  if (!list->is_array()) return invalid_argument(what + ": expected an array of {\"threads\": t, ...} objects");
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string at = what + "[" + std::to_string(i) + "]";
    if (!(*list)[i].is_object()) return invalid_argument(at + ": expected an object");
    JsonReader e((*list)[i], at);
    Calibration::ThreadFigures f;
    PIPER_RETURN_IF_ERROR(e.get_int("threads", &f.threads, true, 1, 4096));
    PIPER_RETURN_IF_ERROR(e.get_double("peak_flops_fp32", &f.peak_flops_fp32, true, 1e6, 1e18));
    PIPER_RETURN_IF_ERROR(e.get_double("gemm_half_dim", &f.gemm_half_dim, true, 0.0, 1e6));
    PIPER_RETURN_IF_ERROR(e.get_double("memory_bw_bytes_per_s", &f.memory_bw_bytes_per_s, true, 1e6, 1e15));
    PIPER_RETURN_IF_ERROR(e.get_double("task_overhead_s", &f.task_overhead_s, false, 0.0, 1.0));
    PIPER_RETURN_IF_ERROR(e.check_no_unknown_keys());
    if (!out->empty() && f.threads <= out->back().threads) {
      return invalid_argument(at + ": threads = " + std::to_string(f.threads) +
                              " after an entry for " + std::to_string(out->back().threads) +
                              "; list the thread counts in ascending order, each once");
    }
    out->push_back(f);
  }
  return ok_status();
}

// "core_sharing": [{"ranks": n, "efficiency": e}, ...] for n = 2, 3, ... in turn.
// "expert_shape": {"hidden": H, "ffn": F}, required beside any expert_call_*_s or expert_row_*_s: the figures are
// scaled from it to a model's experts (cost/layer_cost.cc).
Status read_expert_shape(JsonReader& r, Calibration* c) {
  const bool figures = c->expert_call_forward_s > 0 || c->expert_call_backward_input_s > 0 ||
                       c->expert_call_backward_weight_s > 0 || c->expert_row_forward_s > 0 ||
                       c->expert_row_backward_input_s > 0 || c->expert_row_backward_weight_s > 0;
  const Json* shape = r.find("expert_shape");
  const std::string what = r.field_path("expert_shape");
  if (shape == nullptr) {
    if (!figures) return ok_status();
    return invalid_argument(what +
                            ": missing; a file with expert_call_*_s or expert_row_*_s must say the expert "
                            "shape they were measured at, {\"hidden\": H, \"ffn\": F} (piper calibrate "
                            "writes it)");
  }
  if (!shape->is_object()) return invalid_argument(what + ": expected {\"hidden\": H, \"ffn\": F}");
  JsonReader e(*shape, what);
  PIPER_RETURN_IF_ERROR(e.get_double("hidden", &c->expert_shape_hidden, true, 1.0, 1e6));
  PIPER_RETURN_IF_ERROR(e.get_double("ffn", &c->expert_shape_ffn, true, 1.0, 1e7));
  return e.check_no_unknown_keys();
}

// `name`: [{"ranks": n, "efficiency": e}, ...] for n = 2, 3, ... in turn (core_sharing, a task profile's sharing).
Status read_sharing_list(JsonReader& r, const char* name, std::vector<double>* out) {
  const Json* list = r.find(name);
  if (list == nullptr) return ok_status();
  const std::string what = r.field_path(name);
  if (!list->is_array()) return invalid_argument(what + ": expected an array of {\"ranks\": n, \"efficiency\": e}");
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string at = what + "[" + std::to_string(i) + "]";
    if (!(*list)[i].is_object()) return invalid_argument(at + ": expected an object");
    JsonReader e((*list)[i], at);
    int ranks = 0;
    double efficiency = 0;
    PIPER_RETURN_IF_ERROR(e.get_int("ranks", &ranks, true, 2, 4096));
    PIPER_RETURN_IF_ERROR(e.get_double("efficiency", &efficiency, true, kMinSharingEfficiency, kMaxSharingEfficiency));
    // Measured beside it by `piper calibrate`, for the record (docs/calibration.md); the model uses `efficiency`.
    double informational = 0;
    for (const char* key : {"stream_efficiency", "wall_efficiency", "stream_wall_efficiency"}) {
      PIPER_RETURN_IF_ERROR(e.get_double(key, &informational, false, 0.0, 10.0));
    }
    PIPER_RETURN_IF_ERROR(e.check_no_unknown_keys());
    if (ranks != static_cast<int>(i) + 2) {
      return invalid_argument(at + ": ranks = " + std::to_string(ranks) + " where " + std::to_string(i + 2) +
                              " is due; list n = 2, 3, ... in turn");
    }
    out->push_back(efficiency);
  }
  return ok_status();
}

// One point of "task_profiles"[i].points.
Status read_task_point(JsonReader& e, Calibration::TaskProfilePoint* p) {
  PIPER_RETURN_IF_ERROR(e.get_int("threads", &p->threads, true, 1, 4096));
  PIPER_RETURN_IF_ERROR(e.get_double("tokens", &p->tokens, true, 1.0, 1e9));
  PIPER_RETURN_IF_ERROR(e.get_string("task", &p->task, true));
  PIPER_RETURN_IF_ERROR(e.get_double("calls", &p->calls, true, 1.0, 1e9));
  PIPER_RETURN_IF_ERROR(e.get_double("measured_s", &p->measured_s, true, 1e-9, 1e6));
  PIPER_RETURN_IF_ERROR(e.get_double("priced_s", &p->priced_s, true, 1e-12, 1e6));
  PIPER_RETURN_IF_ERROR(e.check_no_unknown_keys());
  if (!task_scale_plausible(p->scale())) {
    return invalid_argument(e.field_path("measured_s") + ": " + p->task + " measured " + std::to_string(p->scale()) +
                            "x its price, outside 1/" + std::to_string(static_cast<int>(kMaxTaskScale)) + ".." +
                            std::to_string(static_cast<int>(kMaxTaskScale)) +
                            ": a disturbed measurement; run `piper calibrate --model ...` again on a quiet machine");
  }
  if (p->task != "update" && !Calibration::parse_task_key(p->task)) {
    return invalid_argument(e.field_path("task") + ": '" + p->task +
                            "' is not a task key; use \"<chunk>.<pass>\" (chunk embed, attn, router, experts, "
                            "shared, mlp or head; pass F, B, W or BW) or \"update\"");
  }
  return ok_status();
}

// One profile of "task_profiles": its model, parameter count and seq, and its points, each (threads, tokens, task)
// once.
Status read_task_profile(JsonReader& e, Calibration::TaskProfile* t) {
  PIPER_RETURN_IF_ERROR(e.get_string("model", &t->model, true));
  if (t->model.empty()) return invalid_argument(e.field_path("model") + ": empty; the model's name");
  PIPER_RETURN_IF_ERROR(e.get_int("parameters", &t->parameters, true, 1, int64_t{1} << 50));
  PIPER_RETURN_IF_ERROR(e.get_int("seq", &t->seq, true, 1, int64_t{1} << 30));
  const Json* points = e.find("points");
  if (points == nullptr || !points->is_array() || points->size() == 0) {
    return invalid_argument(e.field_path("points") + ": expected a non-empty array of measured points");
  }
  for (size_t k = 0; k < points->size(); ++k) {
    const std::string at = e.field_path("points") + "[" + std::to_string(k) + "]";
    if (!(*points)[k].is_object()) return invalid_argument(at + ": expected an object");
    JsonReader pe((*points)[k], at);
    Calibration::TaskProfilePoint p;
    PIPER_RETURN_IF_ERROR(read_task_point(pe, &p));
    for (const Calibration::TaskProfilePoint& q : t->points) {
      if (q.threads == p.threads && q.tokens == p.tokens && q.task == p.task) {
        return invalid_argument(at + ": a second point for " + p.task + " at " + std::to_string(p.threads) +
                                " thread(s) and " + std::to_string(static_cast<int64_t>(p.tokens)) +
                                " tokens; keep one (piper calibrate --model writes each once)");
      }
    }
    t->points.push_back(std::move(p));
  }
  PIPER_RETURN_IF_ERROR(read_sharing_list(e, "sharing", &t->sharing));
  return e.check_no_unknown_keys();
}

// "task_profiles": [{"model": M, "parameters": N, "seq": S, "points": [...]}, ...]; a (model, seq) at most once.
Status read_task_profiles(JsonReader& r, std::vector<Calibration::TaskProfile>* out) {
  const Json* list = r.find("task_profiles");
  if (list == nullptr) return ok_status();
  const std::string what = r.field_path("task_profiles");
  if (!list->is_array()) return invalid_argument(what + ": expected an array of {\"model\": M, ...} objects");
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string at = what + "[" + std::to_string(i) + "]";
    if (!(*list)[i].is_object()) return invalid_argument(at + ": expected an object");
    JsonReader e((*list)[i], at);
    Calibration::TaskProfile t;
    PIPER_RETURN_IF_ERROR(read_task_profile(e, &t));
    for (const Calibration::TaskProfile& o : *out) {
      if (o.model == t.model && o.seq == t.seq) {
        return invalid_argument(at + ": a second profile of " + t.model + " at seq " + std::to_string(t.seq) +
                                "; keep one");
      }
    }
    out->push_back(std::move(t));
  }
  return ok_status();
}

}  // namespace

std::optional<Calibration::TaskKey> Calibration::parse_task_key(const std::string& task) {
  static constexpr const char* kPasses[4] = {"F", "B", "W", "BW"};
  const size_t dot = task.find('.');
  if (dot == std::string::npos) return std::nullopt;
  const std::optional<Part> part = chunk_part(task.substr(0, dot));
  const std::string pass = task.substr(dot + 1);
  for (int k = 0; part && k < 4; ++k) {
    if (pass == kPasses[k]) return TaskKey{*part, k};
  }
  return std::nullopt;
}

const Calibration::ThreadFigures* Calibration::figures_for_threads(int threads) const {
  for (const ThreadFigures& f : thread_figures) {
    if (f.threads == threads) return &f;
  }
  return nullptr;
}

double Calibration::sharing_efficiency(int ranks) const {
  if (ranks <= 1 || core_sharing.empty()) return 1.0;
  return core_sharing[std::min(static_cast<size_t>(ranks - 2), core_sharing.size() - 1)];
}

Result<Calibration> Calibration::from_json(const Json& json, const std::string& what) {
  if (!json.is_object()) return invalid_argument(what + ": expected a JSON object");
  Calibration c;
  JsonReader r(json, what);
  PIPER_RETURN_IF_ERROR(r.get_double("gemm_efficiency", &c.gemm_efficiency, false, 0.01, 1.0));
  PIPER_RETURN_IF_ERROR(r.get_double("gemm_half_dim", &c.gemm_half_dim, false, 0.0, 1e6));
  PIPER_RETURN_IF_ERROR(r.get_double("memory_bw_efficiency", &c.memory_bw_efficiency, false, 0.01, 1.0));
  PIPER_RETURN_IF_ERROR(r.get_double("workspace_bytes", &c.workspace_bytes, false, 0.0, 1e15));
  PIPER_RETURN_IF_ERROR(r.get_double("expert_load_imbalance", &c.expert_load_imbalance, false, 1.0, 1e3));
  PIPER_RETURN_IF_ERROR(r.get_double("attention_score_bytes", &c.attention_score_bytes, false, 0.0, kMaxAttentionScoreBytes));
  PIPER_RETURN_IF_ERROR(r.get_double("expert_call_forward_s", &c.expert_call_forward_s, false, 0.0, kMaxExpertCallS));
  PIPER_RETURN_IF_ERROR(
      r.get_double("expert_call_backward_input_s", &c.expert_call_backward_input_s, false, 0.0, kMaxExpertCallS));
  PIPER_RETURN_IF_ERROR(
      r.get_double("expert_call_backward_weight_s", &c.expert_call_backward_weight_s, false, 0.0, kMaxExpertCallS));
  PIPER_RETURN_IF_ERROR(r.get_double("expert_row_forward_s", &c.expert_row_forward_s, false, 0.0, kMaxExpertRowS));
  PIPER_RETURN_IF_ERROR(
      r.get_double("expert_row_backward_input_s", &c.expert_row_backward_input_s, false, 0.0, kMaxExpertRowS));
  PIPER_RETURN_IF_ERROR(
      r.get_double("expert_row_backward_weight_s", &c.expert_row_backward_weight_s, false, 0.0, kMaxExpertRowS));
  PIPER_RETURN_IF_ERROR(read_expert_shape(r, &c));
  PIPER_RETURN_IF_ERROR(r.get_bool("recompute_reruns_tp_collectives", &c.recompute_reruns_tp_collectives, false));
  PIPER_RETURN_IF_ERROR(r.get_bool("p2p_blocking", &c.p2p_blocking, false));
  PIPER_RETURN_IF_ERROR(r.get_bool("p2p_scatter_gather", &c.p2p_scatter_gather, false));
  PIPER_RETURN_IF_ERROR(r.get_bool("dp_reduce_after_backward", &c.dp_reduce_after_backward, false));
  PIPER_RETURN_IF_ERROR(r.get_double("tp_overlap_gemm_sm_share", &c.tp_overlap_gemm_sm_share, false, 0.05, 1.0));
  PIPER_RETURN_IF_ERROR(r.get_bool("gemm_table", &c.gemm_table, false));
  PIPER_RETURN_IF_ERROR(r.get_double("peak_flops_fp32", &c.peak_flops_fp32, false, 1e6, 1e18));
  PIPER_RETURN_IF_ERROR(r.get_double("memory_bw_bytes_per_s", &c.memory_bw_bytes_per_s, false, 1e6, 1e15));
  PIPER_RETURN_IF_ERROR(r.get_double("copy_bw_bytes_per_s", &c.copy_bw_bytes_per_s, false, 1e6, 1e15));
  PIPER_RETURN_IF_ERROR(read_thread_figures(r, &c.thread_figures));
  PIPER_RETURN_IF_ERROR(read_sharing_list(r, "core_sharing", &c.core_sharing));
  PIPER_RETURN_IF_ERROR(read_task_profiles(r, &c.task_profiles));
  std::string source;  // where the numbers come from (`piper calibrate` writes it); informational
  PIPER_RETURN_IF_ERROR(r.get_string("source", &source, false));
  PIPER_RETURN_IF_ERROR(r.check_no_unknown_keys());
  return c;
}

Result<Calibration> Calibration::load(const std::string& path) {
  PIPER_ASSIGN_OR_RETURN(Json j, load_json_file(path));
  return from_json(j, path);
}

double rate_share(const NodeSpec& node, const Calibration& calibration) {
  const double share = node.static_core_share();
  if (!(node.shared_cores > 0)) return share;
  const double sharing = calibration.sharing_efficiency(node.devices_per_node);
  return sharing == 1.0 ? share : share * sharing;
}

DeviceModel::DeviceModel(const DeviceSpec& device, DType compute_dtype, const Calibration& calibration,
                         double rate_share, double device_cores) {
  core_share_ = std::min(1.0, device_cores * rate_share);
  switch (compute_dtype) {
    case DType::kFP32:
      peak_flops_ = calibration.peak_flops_fp32 > 0 ? calibration.peak_flops_fp32 : device.peak_flops_fp32;
      break;
    case DType::kBF16:
    case DType::kFP16:
      peak_flops_ = device.peak_flops_bf16;
      break;
    case DType::kFP8:
      peak_flops_ = device.peak_flops_fp8 > 0 ? device.peak_flops_fp8 : device.peak_flops_bf16;
      break;
  }
  gemm_efficiency_ = calibration.gemm_efficiency > 0 ? calibration.gemm_efficiency : device.gemm_efficiency;
  gemm_half_dim_ = calibration.gemm_half_dim;
  memory_bw_ = (calibration.memory_bw_bytes_per_s > 0 ? calibration.memory_bw_bytes_per_s
                                                       : device.memory_bw_bytes_per_s) *
               calibration.memory_bw_efficiency;
  if (calibration.gemm_table && calibration.gemm_efficiency <= 0) gemm_table_ = find_gemm_table(device, compute_dtype);
  if (rate_share != 1.0) {
    peak_flops_ *= rate_share;
    memory_bw_ *= rate_share;
  }
}

double DeviceModel::time_s(double flops, double bytes, double min_dim, bool attention_kernel) const {
  double eff = attention_kernel ? curve_efficiency(min_dim) : gemm_efficiency(min_dim);
  double t_compute = flops > 0 ? flops / (peak_flops_ * (eff > 0 ? eff : gemm_efficiency_)) : 0.0;
  double t_memory = bytes > 0 ? bytes / memory_bw_ : 0.0;
  return std::max(t_compute, t_memory);
}

}  // namespace piper::cost
