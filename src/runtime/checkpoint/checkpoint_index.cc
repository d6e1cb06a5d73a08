// Parsing and validating a checkpoint's index.json (checkpoint.h, checkpoint_format.h). Every key is known,
// every number in its range, every piece consistent with its tensor, and the whole index matches its checksum;
// otherwise DataLoss naming the index and the field (an older or newer format: Unimplemented naming versions).
#include <algorithm>
#include <cstdio>
#include <set>

#include "piper/runtime/checkpoint/checkpoint_format.h"

namespace piper::checkpoint_format {
namespace {

// Refuses keys of `obj` outside required + optional, and missing required keys; `where` names obj.
Status check_keys(const Json& obj, const std::string& where, const std::vector<std::string>& required,
                  const std::vector<std::string>& optional, const std::string& path) {
  if (!obj.is_object()) return bad_index(path, where + " is not a JSON object");
  std::string known;
  for (const auto* list : {&required, &optional}) {
    for (const std::string& k : *list) known += (known.empty() ? "" : ", ") + k;
  }
  for (const auto& [key, value] : obj.items()) {
    if (std::find(required.begin(), required.end(), key) == required.end() &&
        std::find(optional.begin(), optional.end(), key) == optional.end()) {
      return bad_index(path, where + " has the unknown key '" + key + "' (known: " + known + ")");
    }
  }
  for (const std::string& k : required) {
    if (!obj.contains(k)) return bad_index(path, where + " lacks the key '" + k + "'");
  }
  return ok_status();
}

// An integer field in [lo, hi]; the message shows the value as written.
Status get_int(const Json& obj, const std::string& key, const std::string& where, int64_t lo, int64_t hi,
               const std::string& path, int64_t* out) {
  const Json& v = obj[key];
  bool in_range = false;
  if (v.is_number_unsigned()) {
    in_range = v.get<uint64_t>() <= static_cast<uint64_t>(hi) && static_cast<int64_t>(v.get<uint64_t>()) >= lo;
  } else if (v.is_number_integer()) {
    in_range = v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  }
  if (!in_range) {
    return bad_index(path, where + key + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                               "], got " + v.dump());
  }
  *out = v.get<int64_t>();
  return ok_status();
}

Status get_u64(const Json& obj, const std::string& key, const std::string& where, const std::string& path,
               uint64_t* out) {
  if (!obj[key].is_number_unsigned()) {
    return bad_index(path, where + key + " must be a non-negative 64-bit integer, got " + obj[key].dump());
  }
  *out = obj[key].get<uint64_t>();
  return ok_status();
}

Status get_string(const Json& obj, const std::string& key, const std::string& where, const std::string& path,
                  std::string* out) {
  if (!obj[key].is_string()) return bad_index(path, where + key + " must be a string, got " + obj[key].dump());
  *out = obj[key].get<std::string>();
  return ok_status();
}

// Sizes and offsets: each in [0, 2^40] (no sum of two overflows), at most Tensor::kMaxDims of them.
Status get_shape(const Json& obj, const std::string& key, const std::string& where, const std::string& path,
                 Shape* out) {
  constexpr int64_t kMaxDim = int64_t{1} << 40;
  const Json& v = obj[key];
  if (!v.is_array() || v.size() > static_cast<size_t>(Tensor::kMaxDims)) {
    return bad_index(path, where + key + " must be an array of at most " + std::to_string(Tensor::kMaxDims) +
                               " sizes, got " + v.dump());
  }
  out->clear();
  for (const Json& d : v) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(kMaxDim)) {
      return bad_index(path, where + key + " holds " + d.dump() + "; sizes are integers in [0, 2^40]");
    }
    out->push_back(d.get<int64_t>());
  }
  return ok_status();
}

Status parse_model(const Json& model, const std::string& path, CheckpointMeta* meta) {
  PIPER_RETURN_IF_ERROR(check_keys(model, "model", {"name", "arch_hash", "arch"}, {}, path));
  PIPER_RETURN_IF_ERROR(get_string(model, "name", "model.", path, &meta->model));
  std::string hash;
  PIPER_RETURN_IF_ERROR(get_string(model, "arch_hash", "model.", path, &hash));
  if (!model["arch"].is_object()) return bad_index(path, "model.arch must be an object of ModelSpec fields");
  meta->model_arch.clear();
  for (const auto& [field, value] : model["arch"].items()) meta->model_arch[field] = value.dump();
  if (architecture_hash(meta->model_arch) != hash) {
    return bad_index(path, "model.arch_hash " + hash + " does not match model.arch (whose hash is " +
                               architecture_hash(meta->model_arch) + ")");
  }
  return ok_status();
}

Status parse_placement(const Json& table, const std::string& path, CheckpointMeta* meta) {
  meta->expert_placement.clear();
  if (!table.is_object()) return bad_index(path, "expert_placement is not an object of layer -> slots");
  for (const auto& [layer, slots] : table.items()) {
    int l = -1;
    if (std::sscanf(layer.c_str(), "%d", &l) != 1 || l < 0 || std::to_string(l) != layer || !slots.is_array()) {
      return bad_index(path, "expert_placement." + layer + " is not a layer index with an array of experts");
    }
    std::vector<int>& out = meta->expert_placement[l];
    for (const Json& e : slots) {
      if (!e.is_number_unsigned() || e.get<uint64_t>() > (1u << 20)) {
        return bad_index(path, "expert_placement." + layer + " holds " + e.dump() + ", not an expert index");
      }
      out.push_back(e.get<int>());
    }
  }
  return ok_status();
}

Status parse_meta(const Json& index, const std::string& path, const std::string& dir_name, CheckpointMeta* meta) {
  PIPER_RETURN_IF_ERROR(get_int(index, "step", "", 0, kMaxStep, path, &meta->step));
  long long dir_step = -1;
  char tail = 0;
  if (std::sscanf(dir_name.c_str(), "step-%lld%c", &dir_step, &tail) == 1 &&
      dir_name == checkpoint_step_name(dir_step) && dir_step != meta->step) {
    return bad_index(path, "step is " + std::to_string(meta->step) + " but the directory is '" + dir_name + "' (step " +
                               std::to_string(dir_step) + ")");
  }
  const Json &data = index["data_position"], &rng = index["rng"];
  PIPER_RETURN_IF_ERROR(check_keys(data, "data_position", {"epoch", "index"}, {}, path));
  PIPER_RETURN_IF_ERROR(get_int(data, "epoch", "data_position.", 0, kMaxStep, path, &meta->data.epoch));
  PIPER_RETURN_IF_ERROR(get_int(data, "index", "data_position.", 0, int64_t{1} << 53, path, &meta->data.index));
  PIPER_RETURN_IF_ERROR(check_keys(rng, "rng", {"seed", "stream", "counter"}, {}, path));
  PIPER_RETURN_IF_ERROR(get_u64(rng, "seed", "rng.", path, &meta->rng.seed));
  PIPER_RETURN_IF_ERROR(get_u64(rng, "stream", "rng.", path, &meta->rng.stream));
  PIPER_RETURN_IF_ERROR(get_u64(rng, "counter", "rng.", path, &meta->rng.counter));
  PIPER_RETURN_IF_ERROR(get_int(index, "seq_len", "", 1, int64_t{1} << 24, path, &meta->seq_len));
  int64_t world = 0;
  PIPER_RETURN_IF_ERROR(get_int(index, "world_size", "", 1, int64_t{1} << 20, path, &world));
  meta->world_size = static_cast<int>(world);
  PIPER_RETURN_IF_ERROR(get_string(index, "strategy", "", path, &meta->strategy));
  PIPER_RETURN_IF_ERROR(parse_model(index["model"], path, meta));
  meta->expert_placement.clear();
  if (index.contains("expert_placement")) PIPER_RETURN_IF_ERROR(parse_placement(index["expert_placement"], path, meta));
  return ok_status();
}

Status parse_files(const Json& files, const std::string& path, int world_size,
                   std::map<std::string, CheckpointReader::FileInfo>* out) {
  if (!files.is_object()) return bad_index(path, "files must be an object of file name -> {bytes, fnv1a64}");
  for (const auto& [file, info] : files.items()) {
    int rank = -1;
    char tail = 0;
    char expect[40];
    const bool named = std::sscanf(file.c_str(), "rank-%d.safetensors%c", &rank, &tail) == 1 && rank >= 0;
    if (named) std::snprintf(expect, sizeof(expect), "rank-%05d.safetensors", rank);
    if (!named || file != expect || rank >= world_size) {
      return bad_index(path, "files has '" + file + "', not rank-R.safetensors for a rank R of the " +
                                 std::to_string(world_size) + " writers");
    }
    const std::string where = "files." + file + ".";
    PIPER_RETURN_IF_ERROR(check_keys(info, "files." + file, {"bytes", "fnv1a64"}, {}, path));
    CheckpointReader::FileInfo& f = (*out)[file];
    PIPER_RETURN_IF_ERROR(get_u64(info, "bytes", where, path, &f.bytes));
    PIPER_RETURN_IF_ERROR(get_string(info, "fnv1a64", where, path, &f.checksum));
  }
  return ok_status();
}

Status parse_piece(const Json& p, const std::string& name, const CheckpointReader::TensorInfo& t,
                   const std::string& path, CheckpointReader::PieceRef* ref) {
  const std::string where = "tensors." + name + ".pieces[]";
  PIPER_RETURN_IF_ERROR(
      check_keys(p, where, {"file", "key", "offset", "extent", "range", "data_offsets", "fnv1a64"}, {}, path));
  PIPER_RETURN_IF_ERROR(get_string(p, "file", where + ".", path, &ref->file));
  PIPER_RETURN_IF_ERROR(get_string(p, "key", where + ".", path, &ref->key));
  PIPER_RETURN_IF_ERROR(get_shape(p, "offset", where + ".", path, &ref->offset));
  PIPER_RETURN_IF_ERROR(get_shape(p, "extent", where + ".", path, &ref->extent));
  Shape range, offsets;
  PIPER_RETURN_IF_ERROR(get_shape(p, "range", where + ".", path, &range));
  PIPER_RETURN_IF_ERROR(get_shape(p, "data_offsets", where + ".", path, &offsets));
  if (range.size() != 2 || offsets.size() != 2) {
    return bad_index(path, where + ": range and data_offsets must be [begin, end]");
  }
  ref->begin = range[0];
  ref->end = range[1];
  ref->data_begin = static_cast<uint64_t>(offsets[0]);
  ref->data_end = static_cast<uint64_t>(offsets[1]);
  PIPER_RETURN_IF_ERROR(get_string(p, "fnv1a64", where + ".", path, &ref->checksum));
  const Status box = check_box(name, t.shape, ref->offset, ref->extent, ref->begin, ref->end);
  if (!box.ok()) return bad_index(path, where + ": " + box.message());
  const std::string key = piece_key(name, t.shape, ref->offset, ref->extent, ref->begin, ref->end);
  if (ref->key != key) return bad_index(path, where + ": key '" + ref->key + "' should be '" + key + "'");
  if (ref->data_end - ref->data_begin != static_cast<uint64_t>(ref->end - ref->begin) * 4) {
    return bad_index(path, where + " '" + key + "': data_offsets do not hold its " +
                               std::to_string(ref->end - ref->begin) + " floats");
  }
  return ok_status();
}

Status parse_tensors(const Json& tensors, const std::string& path, Index* index) {
  if (!tensors.is_object()) return bad_index(path, "tensors must be an object of tensor name -> {shape, pieces}");
  std::set<std::pair<std::string, std::string>> keys;
  for (const auto& [name, info] : tensors.items()) {
    const std::string where = "tensors." + name;
    PIPER_RETURN_IF_ERROR(check_keys(info, where, {"shape", "dtype", "optimizer", "pieces"}, {}, path));
    CheckpointReader::TensorInfo t;
    PIPER_RETURN_IF_ERROR(get_shape(info, "shape", where + ".", path, &t.shape));
    Result<int64_t> numel = shape_numel(t.shape);
    if (!numel.ok()) return bad_index(path, where + ": " + numel.status().message());
    PIPER_RETURN_IF_ERROR(get_string(info, "dtype", where + ".", path, &t.dtype));
    if (t.dtype != kDtype) {
      return unimplemented("checkpoint index '" + path + "': tensor '" + name + "' has dtype " + t.dtype +
                           "; this build reads " + kDtype + " checkpoints only");
    }
    if (!info["optimizer"].is_boolean()) return bad_index(path, where + ".optimizer must be true or false");
    t.optimizer = info["optimizer"].get<bool>();
    if (!info["pieces"].is_array()) return bad_index(path, where + ".pieces must be an array");
    for (const Json& p : info["pieces"]) {
      CheckpointReader::PieceRef ref;
      PIPER_RETURN_IF_ERROR(parse_piece(p, name, t, path, &ref));
      if (!index->files.count(ref.file)) {
        return bad_index(path, where + ": piece file '" + ref.file + "' is not in files");
      }
      if (!keys.emplace(ref.file, ref.key).second) return bad_index(path, "piece '" + ref.key + "' is listed twice");
      t.pieces.push_back(std::move(ref));
    }
    index->tensors[name] = std::move(t);
  }
  return ok_status();
}

}  // namespace

Result<Index> parse_index(const std::string& text, const std::string& path, const std::string& dir_name) {
  Result<Json> parsed = parse_json(text, path);
  if (!parsed.ok()) return bad_index(path, parsed.status().message());
  const Json& json = *parsed;
  if (!json.is_object() || !json.contains("format") || json["format"] != kFormat) {
    return bad_index(path, std::string("format is not '") + kFormat + "'");
  }
  if (!json.contains("version") || !json["version"].is_number_unsigned()) {
    return bad_index(path, "version is missing or not a non-negative integer");
  }
  const uint64_t version = json["version"].get<uint64_t>();
  if (version != static_cast<uint64_t>(kVersion)) {
    const std::string why = version < static_cast<uint64_t>(kVersion)
                                ? " (older checkpoints lack the model identity and header checksums that make a "
                                  "resume safe); resume it with the Piper build that wrote it, or start without "
                                  "--resume"
                                : " (written by a newer Piper); resume it with that build";
    return unimplemented("checkpoint '" + path + "' has format version " + std::to_string(version) +
                         "; this build reads version " + std::to_string(kVersion) + " only" + why);
  }
  PIPER_RETURN_IF_ERROR(check_keys(json, "the index",
                                   {"format", "version", "step", "data_position", "rng", "seq_len", "model", "strategy",
                                    "world_size", "files", "tensors", kIndexChecksumKey},
                                   {"expert_placement"}, path));
  Index index;
  PIPER_RETURN_IF_ERROR(parse_meta(json, path, dir_name, &index.meta));
  PIPER_RETURN_IF_ERROR(parse_files(json["files"], path, index.meta.world_size, &index.files));
  PIPER_RETURN_IF_ERROR(parse_tensors(json["tensors"], path, &index));
  std::string recorded;
  PIPER_RETURN_IF_ERROR(get_string(json, kIndexChecksumKey, "", path, &recorded));
  const std::string actual = index_checksum(json);
  if (recorded != actual) {
    return bad_index(path, std::string("its contents do not match its ") + kIndexChecksumKey + " (recorded " +
                               recorded + ", found " + actual + "): it was edited or damaged after it was written");
  }
  return index;
}

}  // namespace piper::checkpoint_format
