#include "piper/spec/train_json.h"

namespace piper {
namespace {

Status read_dtype(JsonReader& r, const std::string& key, DType* out) {
  std::string text = to_string(*out);
  PIPER_RETURN_IF_ERROR(r.get_enum(key, &text, {"fp32", "bf16", "fp16", "fp8"}, false));
  PIPER_ASSIGN_OR_RETURN(*out, parse_dtype(text, r.field_path(key)));
  return ok_status();
}

Status read_optional_dtype(JsonReader& r, const std::string& key, std::optional<DType>* out) {
  if (r.find(key) == nullptr) return ok_status();
  DType d = out->value_or(DType::kBF16);
  PIPER_RETURN_IF_ERROR(read_dtype(r, key, &d));
  *out = d;
  return ok_status();
}

Status read_optimizer(const Json& json, OptimizerSpec* o) {
  JsonReader r(json, "train.optimizer");
  PIPER_RETURN_IF_ERROR(r.get_enum("name", &o->name, {"adamw"}, false));
  PIPER_RETURN_IF_ERROR(r.get_double("lr", &o->lr, false));
  PIPER_RETURN_IF_ERROR(r.get_double("beta1", &o->beta1, false));
  PIPER_RETURN_IF_ERROR(r.get_double("beta2", &o->beta2, false));
  PIPER_RETURN_IF_ERROR(r.get_double("eps", &o->eps, false));
  PIPER_RETURN_IF_ERROR(r.get_double("weight_decay", &o->weight_decay, false));
  PIPER_RETURN_IF_ERROR(r.get_double("grad_clip", &o->grad_clip, false));
  return r.check_no_unknown_keys();
}

}  // namespace

Result<TrainSpec> train_from_json(const Json& json, const std::string& what) {
  if (!json.is_object()) return invalid_argument(what + ": a train spec must be a JSON object");
  TrainSpec t;
  JsonReader r(json, "train");
  Status s = [&]() -> Status {
    PIPER_RETURN_IF_ERROR(r.get_int("global_batch", &t.global_batch, true, 1));
    PIPER_RETURN_IF_ERROR(r.get_int("micro_batch_size", &t.micro_batch_size, false, 1));
    PIPER_RETURN_IF_ERROR(r.get_int("seq_len", &t.seq_len, false, 1));
    std::string precision = "bf16";
    PIPER_RETURN_IF_ERROR(r.get_enum("precision", &precision, {"bf16", "fp8", "mxfp8"}, false));
    PIPER_ASSIGN_OR_RETURN(const Precision p, parse_precision(precision, r.field_path("precision")));
    t.apply_precision(p);  // the recipe first; the dtype keys below override it
    PIPER_RETURN_IF_ERROR(read_dtype(r, "param_dtype", &t.param_dtype));
    PIPER_RETURN_IF_ERROR(read_dtype(r, "grad_dtype", &t.grad_dtype));
    PIPER_RETURN_IF_ERROR(read_dtype(r, "master_dtype", &t.master_dtype));
    PIPER_RETURN_IF_ERROR(read_dtype(r, "optimizer_dtype", &t.optimizer_dtype));
    PIPER_RETURN_IF_ERROR(read_dtype(r, "activation_dtype", &t.activation_dtype));
    PIPER_RETURN_IF_ERROR(read_optional_dtype(r, "comm_dtype", &t.comm_dtype));
    PIPER_RETURN_IF_ERROR(read_optional_dtype(r, "dispatch_dtype", &t.dispatch_dtype));
    if (const Json* o = r.find("optimizer")) PIPER_RETURN_IF_ERROR(read_optimizer(*o, &t.optimizer));
    PIPER_RETURN_IF_ERROR(r.check_no_unknown_keys());
    return t.validate();
  }();
  if (!s.ok()) return s.with_context(what);
  return t;
}

Result<TrainSpec> load_train(const std::string& path) {
  PIPER_ASSIGN_OR_RETURN(Json json, load_json_file(path));
  return train_from_json(json, path);
}

OrderedJson to_json(const TrainSpec& t) {
  OrderedJson j;
  j["global_batch"] = t.global_batch;
  j["micro_batch_size"] = t.micro_batch_size;
  j["seq_len"] = t.seq_len;
  j["param_dtype"] = to_string(t.param_dtype);
  j["grad_dtype"] = to_string(t.grad_dtype);
  j["master_dtype"] = to_string(t.master_dtype);
  j["optimizer_dtype"] = to_string(t.optimizer_dtype);
  j["activation_dtype"] = to_string(t.activation_dtype);
  j["precision"] = to_string(t.precision);
  if (t.comm_dtype) j["comm_dtype"] = to_string(*t.comm_dtype);
  if (t.dispatch_dtype) j["dispatch_dtype"] = to_string(*t.dispatch_dtype);
  j["optimizer"] = {
      {"name", t.optimizer.name},          {"lr", t.optimizer.lr},   {"beta1", t.optimizer.beta1},
      {"beta2", t.optimizer.beta2},        {"eps", t.optimizer.eps}, {"weight_decay", t.optimizer.weight_decay},
      {"grad_clip", t.optimizer.grad_clip}};
  return j;
}

}  // namespace piper
