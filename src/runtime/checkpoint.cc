#include "piper/runtime/checkpoint.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "piper/base/json.h"
#include "piper/runtime/safetensors.h"

namespace piper {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "piper-checkpoint";
constexpr int kVersion = 1;
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

Status bad_index(const std::string& path, const std::string& what) {
  return data_loss("checkpoint index '" + path + "' is corrupt: " + what);
}

// Reads a non-negative integer field of the index.
Status get_u64(const Json& obj, const std::string& key, const std::string& path, uint64_t* out) {
  if (!obj.is_object() || !obj.contains(key) || !obj[key].is_number_unsigned()) {
    return bad_index(path, "field '" + key + "' is missing or not a non-negative integer");
  }
  *out = obj[key].get<uint64_t>();
  return ok_status();
}

Status load_file(const std::string& dir, const std::string& file, const Json& index, const std::string& index_path,
                 MemCategory category, std::map<std::string, Tensor>* out) {
  const Json& files = index["files"];
  if (!files.contains(file)) return bad_index(index_path, "files has no entry for '" + file + "'");
  uint64_t bytes = 0;
  PIPER_RETURN_IF_ERROR(get_u64(files[file], "bytes", index_path, &bytes));
  if (!files[file].contains("fnv1a64") || !files[file]["fnv1a64"].is_string()) {
    return bad_index(index_path, "files." + file + ".fnv1a64 is missing");
  }
  const std::string path = (fs::path(dir) / file).string();
  std::error_code ec;
  const uintmax_t actual = fs::file_size(path, ec);
  if (ec) return data_loss("checkpoint file '" + path + "' listed in the index is missing: " + ec.message());
  if (actual != bytes) {
    return data_loss("checkpoint file '" + path + "' has " + std::to_string(actual) + " bytes but the index says " +
                     std::to_string(bytes) + " (truncated or overwritten)");
  }
  PIPER_ASSIGN_OR_RETURN(SafetensorsFile st, read_safetensors(path, category));
  if (hex64(st.data_hash) != files[file]["fnv1a64"].get<std::string>()) {
    return data_loss("checkpoint file '" + path + "': the tensor data does not match the index checksum (corrupted)");
  }
  const Json& weight_map = index["weight_map"];
  size_t expected = 0;
  for (const auto& [name, f] : weight_map.items()) {
    if (f == file) ++expected;
  }
  for (auto& [name, t] : st.tensors) {
    if (!weight_map.contains(name) || weight_map[name] != file) {
      return data_loss("checkpoint file '" + path + "' holds tensor '" + name + "' that the index does not list");
    }
    out->emplace(name, std::move(t));
  }
  if (out->size() != expected) {
    return data_loss("checkpoint file '" + path + "' holds " + std::to_string(out->size()) +
                     " tensors but the index lists " + std::to_string(expected));
  }
  return ok_status();
}

}  // namespace

Status save_checkpoint(const std::string& dir, const CheckpointMeta& meta, const NamedTensors& model,
                       const NamedTensors& optimizer) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return invalid_argument("cannot create checkpoint directory '" + dir + "': " + ec.message());
  OrderedJson index;
  index["format"] = kFormat;
  index["version"] = kVersion;
  index["step"] = meta.step;
  index["data_position"] = {{"epoch", meta.data.epoch}, {"index", meta.data.index}};
  index["rng"] = {{"seed", meta.rng.seed}, {"stream", meta.rng.stream}, {"counter", meta.rng.counter}};
  OrderedJson weight_map = OrderedJson::object();
  for (const auto& [file, tensors] : {std::pair{kModelFile, &model}, std::pair{kOptimizerFile, &optimizer}}) {
    const std::string path = (fs::path(dir) / file).string();
    PIPER_ASSIGN_OR_RETURN(uint64_t hash, write_safetensors(path, *tensors, {{"format", "pt"}}));
    index["files"][file] = {{"bytes", fs::file_size(path)}, {"fnv1a64", hex64(hash)}};
    for (const auto& entry : *tensors) {
      if (weight_map.contains(entry.first)) {
        return invalid_argument("checkpoint: tensor name '" + entry.first + "' is used twice");
      }
      weight_map[entry.first] = file;
    }
  }
  index["weight_map"] = weight_map;
  const std::string index_path = (fs::path(dir) / "index.json").string();
  PIPER_RETURN_IF_ERROR(write_text_file(index_path + ".tmp", index.dump(2) + "\n"));
  fs::rename(index_path + ".tmp", index_path, ec);
  if (ec) return internal_error("cannot rename the checkpoint index into '" + index_path + "': " + ec.message());
  return ok_status();
}

Result<Checkpoint> load_checkpoint(const std::string& dir) {
  const std::string index_path = (fs::path(dir) / "index.json").string();
  std::error_code ec;
  if (!fs::exists(index_path, ec)) {
    return not_found("no checkpoint in '" + dir + "': index.json is missing (an interrupted save leaves none)");
  }
  PIPER_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
  Result<Json> parsed = parse_json(text, index_path);
  if (!parsed.ok()) return bad_index(index_path, parsed.status().message());
  const Json& index = *parsed;
  if (!index.is_object() || index.value("format", "") != kFormat) {
    return bad_index(index_path, std::string("format is not '") + kFormat + "'");
  }
  uint64_t version = 0;
  PIPER_RETURN_IF_ERROR(get_u64(index, "version", index_path, &version));
  if (version != kVersion) {
    return unimplemented("checkpoint '" + index_path + "' has version " + std::to_string(version) +
                         "; this build reads version " + std::to_string(kVersion));
  }
  if (!index.contains("files") || !index["files"].is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return bad_index(index_path, "files or weight_map is missing");
  }
  Checkpoint ckpt;
  uint64_t step = 0, epoch = 0, pos = 0;
  PIPER_RETURN_IF_ERROR(get_u64(index, "step", index_path, &step));
  if (!index.contains("data_position") || !index.contains("rng")) {
    return bad_index(index_path, "data_position or rng is missing");
  }
  PIPER_RETURN_IF_ERROR(get_u64(index["data_position"], "epoch", index_path, &epoch));
  PIPER_RETURN_IF_ERROR(get_u64(index["data_position"], "index", index_path, &pos));
  PIPER_RETURN_IF_ERROR(get_u64(index["rng"], "seed", index_path, &ckpt.meta.rng.seed));
  PIPER_RETURN_IF_ERROR(get_u64(index["rng"], "stream", index_path, &ckpt.meta.rng.stream));
  PIPER_RETURN_IF_ERROR(get_u64(index["rng"], "counter", index_path, &ckpt.meta.rng.counter));
  ckpt.meta.step = static_cast<int64_t>(step);
  ckpt.meta.data = {static_cast<int64_t>(epoch), static_cast<int64_t>(pos)};
  PIPER_RETURN_IF_ERROR(load_file(dir, kModelFile, index, index_path, MemCategory::kParameters, &ckpt.model));
  PIPER_RETURN_IF_ERROR(load_file(dir, kOptimizerFile, index, index_path, MemCategory::kOptimizer, &ckpt.optimizer));
  return ckpt;
}

Status restore_tensor(const std::map<std::string, Tensor>& tensors, const std::string& name, Tensor* dst) {
  auto it = tensors.find(name);
  if (it == tensors.end())
    return invalid_argument("checkpoint has no tensor '" + name + "'; was it made for another model?");
  if (it->second.shape() != dst->shape()) {
    return invalid_argument("checkpoint tensor '" + name + "' has shape " + shape_to_string(it->second.shape()) +
                            " but the model expects " + shape_to_string(dst->shape()));
  }
  if (dst->numel() > 0) std::memcpy(dst->data(), it->second.data(), static_cast<size_t>(dst->nbytes()));
  return ok_status();
}

}  // namespace piper
