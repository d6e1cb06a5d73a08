// Reading checkpoints (checkpoint.h); writing is checkpoint_save.cc.
#include "piper/runtime/checkpoint.h"

#include <cinttypes>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "piper/base/json.h"
#include "piper/base/strings.h"
#include "piper/runtime/checkpoint_format.h"
#include "piper/runtime/safetensors.h"

namespace piper {
namespace fs = std::filesystem;
using namespace checkpoint_format;

namespace {

Status get_u64(const Json& obj, const std::string& key, const std::string& path, uint64_t* out) {
  if (!obj.is_object() || !obj.contains(key) || !obj[key].is_number_unsigned()) {
    return bad_index(path, "field '" + key + "' is missing or not a non-negative integer");
  }
  *out = obj[key].get<uint64_t>();
  return ok_status();
}

Status get_shape(const Json& obj, const std::string& key, const std::string& path, Shape* out) {
  if (!obj.is_object() || !obj.contains(key) || !obj[key].is_array()) {
    return bad_index(path, "field '" + key + "' is missing or not an array");
  }
  out->clear();
  for (const Json& v : obj[key]) {
    if (!v.is_number_unsigned()) return bad_index(path, "field '" + key + "' holds a negative or non-integer size");
    out->push_back(v.get<int64_t>());
  }
  return ok_status();
}

// An optional string field ("" when absent); nlohmann's value() would throw on another type.
Status get_optional_string(const Json& obj, const std::string& key, const std::string& path, std::string* out) {
  out->clear();
  if (!obj.contains(key)) return ok_status();
  if (!obj[key].is_string()) return bad_index(path, "field '" + key + "' is not a string");
  *out = obj[key].get<std::string>();
  return ok_status();
}

Status parse_meta(const Json& index, const std::string& path, CheckpointMeta* meta) {
  uint64_t step = 0, epoch = 0, pos = 0, seq = 0, world = 0;
  PIPER_RETURN_IF_ERROR(get_u64(index, "step", path, &step));
  if (!index.contains("data_position") || !index.contains("rng")) {
    return bad_index(path, "data_position or rng is missing");
  }
  PIPER_RETURN_IF_ERROR(get_u64(index["data_position"], "epoch", path, &epoch));
  PIPER_RETURN_IF_ERROR(get_u64(index["data_position"], "index", path, &pos));
  PIPER_RETURN_IF_ERROR(get_u64(index["rng"], "seed", path, &meta->rng.seed));
  PIPER_RETURN_IF_ERROR(get_u64(index["rng"], "stream", path, &meta->rng.stream));
  PIPER_RETURN_IF_ERROR(get_u64(index["rng"], "counter", path, &meta->rng.counter));
  PIPER_RETURN_IF_ERROR(get_u64(index, "seq_len", path, &seq));
  PIPER_RETURN_IF_ERROR(get_u64(index, "world_size", path, &world));
  meta->step = static_cast<int64_t>(step);
  meta->data = {static_cast<int64_t>(epoch), static_cast<int64_t>(pos)};
  meta->seq_len = static_cast<int64_t>(seq);
  meta->world_size = static_cast<int>(world);
  PIPER_RETURN_IF_ERROR(get_optional_string(index, "model", path, &meta->model));
  PIPER_RETURN_IF_ERROR(get_optional_string(index, "strategy", path, &meta->strategy));
  meta->expert_placement.clear();
  if (index.contains("expert_placement")) {
    const Json& table = index["expert_placement"];
    if (!table.is_object()) return bad_index(path, "expert_placement is not an object of layer -> slots");
    for (const auto& [layer, slots] : table.items()) {
      int l = -1;
      if (std::sscanf(layer.c_str(), "%d", &l) != 1 || l < 0 || std::to_string(l) != layer || !slots.is_array()) {
        return bad_index(path, "expert_placement." + layer + " is not a layer index with an array of experts");
      }
      std::vector<int>& out = meta->expert_placement[l];
      for (const Json& e : slots) {
        if (!e.is_number_unsigned() || e.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)) {
          return bad_index(path, "expert_placement." + layer + " holds a non-expert");
        }
        out.push_back(e.get<int>());
      }
    }
  }
  return ok_status();
}

// Resolves ROOT to the step directory holding index.json.
Result<std::string> resolve(const std::string& root) {
  std::error_code ec;
  if (fs::exists(fs::path(root) / kIndexFile, ec)) return root;
  const fs::path latest = fs::path(root) / kLatestFile;
  if (!fs::exists(latest, ec)) {
    return not_found("no checkpoint in '" + root + "': it has neither '" + kLatestFile + "' nor '" + kIndexFile +
                     "' (a save interrupted before its first checkpoint leaves only a .tmp directory); pass the "
                     "directory given to --save");
  }
  PIPER_ASSIGN_OR_RETURN(std::string name, read_text_file(latest.string()));
  name = std::string(trim(name));
  if (name.empty() || name.find('/') != std::string::npos) {
    return data_loss("checkpoint pointer '" + latest.string() + "' is corrupt (holds '" + name +
                     "'); point it at a step-N directory of '" + root + "' or pass that directory to --resume");
  }
  const fs::path dir = fs::path(root) / name;
  if (!fs::exists(dir / kIndexFile, ec)) {
    return data_loss("checkpoint pointer '" + latest.string() + "' names '" + name + "', which has no " +
                     kIndexFile + "; pass another step-N directory of '" + root + "' to --resume");
  }
  return dir.string();
}

}  // namespace

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::open(const std::string& root) {
  PIPER_ASSIGN_OR_RETURN(std::string dir, resolve(root));
  const std::string path = (fs::path(dir) / kIndexFile).string();
  PIPER_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return from_index_text(text, dir, path);
}

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::from_index_text(const std::string& text,
                                                                            const std::string& dir,
                                                                            const std::string& path) {
  Result<Json> parsed = parse_json(text, path);
  if (!parsed.ok()) return bad_index(path, parsed.status().message());
  const Json& index = *parsed;
  if (!index.is_object() || !index.contains("format") || index["format"] != kFormat) {
    return bad_index(path, std::string("format is not '") + kFormat + "'");
  }
  uint64_t version = 0;
  PIPER_RETURN_IF_ERROR(get_u64(index, "version", path, &version));
  if (version != kVersion) {
    return unimplemented("checkpoint '" + path + "' has version " + std::to_string(version) +
                         "; this build reads version " + std::to_string(kVersion) +
                         " (re-save it with the build that wrote it, or start without --resume)");
  }
  auto r = std::unique_ptr<CheckpointReader>(new CheckpointReader());
  r->dir_ = dir;
  PIPER_RETURN_IF_ERROR(parse_meta(index, path, &r->meta_));
  if (!index.contains("files") || !index["files"].is_object() || !index.contains("tensors") ||
      !index["tensors"].is_object()) {
    return bad_index(path, "files or tensors is missing");
  }
  for (const auto& [file, info] : index["files"].items()) {
    uint64_t bytes = 0;
    PIPER_RETURN_IF_ERROR(get_u64(info, "bytes", path, &bytes));
    if (!info.contains("fnv1a64") || !info["fnv1a64"].is_string() || file.find('/') != std::string::npos) {
      return bad_index(path, "files." + file + " has no fnv1a64 or is not a plain file name");
    }
    r->files_[file] = {bytes, info["fnv1a64"].get<std::string>()};
  }
  std::set<std::pair<std::string, std::string>> keys;
  for (const auto& [name, info] : index["tensors"].items()) {
    TensorInfo t;
    PIPER_RETURN_IF_ERROR(get_shape(info, "shape", path, &t.shape));
    if (info.contains("optimizer") && !info["optimizer"].is_boolean()) {
      return bad_index(path, name + ".optimizer is not true or false");
    }
    t.optimizer = info.contains("optimizer") && info["optimizer"].get<bool>();
    if (!info.contains("pieces") || !info["pieces"].is_array()) return bad_index(path, name + ".pieces is missing");
    for (const Json& p : info["pieces"]) {
      PieceRef ref;
      if (!p.is_object() || !p.contains("file") || !p["file"].is_string() || !p.contains("key") ||
          !p["key"].is_string()) {
        return bad_index(path, name + ": a piece has no file or key");
      }
      ref.file = p["file"].get<std::string>();
      ref.key = p["key"].get<std::string>();
      if (!r->files_.count(ref.file)) return bad_index(path, name + ": piece file '" + ref.file + "' is not in files");
      if (!keys.emplace(ref.file, ref.key).second) return bad_index(path, "piece '" + ref.key + "' is listed twice");
      PIPER_RETURN_IF_ERROR(get_shape(p, "offset", path, &ref.offset));
      PIPER_RETURN_IF_ERROR(get_shape(p, "extent", path, &ref.extent));
      Shape range;
      PIPER_RETURN_IF_ERROR(get_shape(p, "range", path, &range));
      if (range.size() != 2) return bad_index(path, name + ": a piece's range is not [begin, end]");
      ref.begin = range[0];
      ref.end = range[1];
      PIPER_RETURN_IF_ERROR(check_box(name, t.shape, ref.offset, ref.extent, ref.begin, ref.end).with_context(path));
      t.pieces.push_back(std::move(ref));
    }
    r->tensors_[name] = std::move(t);
  }
  return r;
}

Result<const Tensor*> CheckpointReader::piece_data(const PieceRef& piece, bool optimizer) {
  auto loaded = loaded_.find(piece.file);
  if (loaded == loaded_.end()) {
    const std::string path = (fs::path(dir_) / piece.file).string();
    const auto& [bytes, hash] = files_.at(piece.file);
    std::error_code ec;
    const uintmax_t actual = fs::file_size(path, ec);
    if (ec) return data_loss("checkpoint file '" + path + "' listed in the index is missing: " + ec.message());
    if (actual != bytes) {
      return data_loss("checkpoint file '" + path + "' has " + std::to_string(actual) + " bytes but the index says " +
                       std::to_string(bytes) + " (truncated or overwritten); resume from an earlier checkpoint");
    }
    PIPER_ASSIGN_OR_RETURN(SafetensorsFile st, read_safetensors(path, optimizer ? MemCategory::kOptimizer
                                                                               : MemCategory::kParameters));
    if (hex64(st.data_hash) != hash) {
      return data_loss("checkpoint file '" + path + "': the tensor data does not match the index checksum "
                       "(corrupted); resume from an earlier checkpoint");
    }
    std::set<std::string> listed;
    for (const auto& [name, t] : tensors_) {
      for (const PieceRef& p : t.pieces) {
        if (p.file == piece.file) listed.insert(p.key);
      }
    }
    std::map<std::string, Tensor> tensors;
    for (auto& [key, t] : st.tensors) {
      if (!listed.count(key)) {
        return data_loss("checkpoint file '" + path + "' holds tensor '" + key + "' that the index does not list");
      }
      tensors.emplace(key, std::move(t));
    }
    if (tensors.size() != listed.size()) {
      return data_loss("checkpoint file '" + path + "' holds " + std::to_string(tensors.size()) +
                       " tensors but the index lists " + std::to_string(listed.size()));
    }
    loaded = loaded_.emplace(piece.file, std::move(tensors)).first;
  }
  const Tensor& t = loaded->second.at(piece.key);
  if (t.numel() != piece.end - piece.begin) {
    return data_loss("checkpoint file '" + (fs::path(dir_) / piece.file).string() + "': tensor '" + piece.key +
                     "' has " + std::to_string(t.numel()) + " elements, the index says " +
                     std::to_string(piece.end - piece.begin));
  }
  return &t;
}

Status CheckpointReader::restore(const std::string& name, const Shape& global_shape, const Shape& offset,
                                 Tensor* dst) {
  return restore_range(name, global_shape, offset, dst->shape(), 0, dst->numel(), dst->data());
}

Status CheckpointReader::restore_range(const std::string& name, const Shape& global_shape, const Shape& offset,
                                       const Shape& extent, int64_t begin, int64_t end, float* dst) {
  auto it = tensors_.find(name);
  const std::string where = "checkpoint '" + dir_ + "'";
  if (it == tensors_.end()) {
    return invalid_argument(where + " has no tensor '" + name + "' (written for model '" + meta_.model +
                            "'); resume with the model it was written for");
  }
  const TensorInfo& info = it->second;
  if (info.shape != global_shape) {
    return invalid_argument(where + ": tensor '" + name + "' has shape " + shape_to_string(info.shape) +
                            " but the model expects " + shape_to_string(global_shape) + " (written for model '" +
                            meta_.model + "'); resume with the model it was written for");
  }
  const Shape dst_offset = offset.empty() ? Shape(global_shape.size(), 0) : offset;
  int64_t numel = 1;
  for (int64_t e : extent) numel *= e;
  PIPER_RETURN_IF_ERROR(check_box(name, global_shape, dst_offset, extent, begin, end));
  // A sub-range is assembled in a whole-box buffer, then cut out.
  const bool whole = begin == 0 && end == numel;
  std::vector<float> box(whole ? 0 : static_cast<size_t>(numel));
  float* out = whole ? dst : box.data();
  std::vector<uint8_t> covered(static_cast<size_t>(numel), 0);
  for (const PieceRef& p : info.pieces) {
    if (!boxes_overlap(p.offset, p.extent, dst_offset, extent) || p.begin == p.end) continue;
    PIPER_ASSIGN_OR_RETURN(const Tensor* data, piece_data(p, info.optimizer));
    copy_piece(p.offset, p.extent, p.begin, p.end, data->data(), dst_offset, extent, out, &covered);
  }
  for (int64_t i = begin; i < end; ++i) {
    if (covered[static_cast<size_t>(i)] != 1) {
      return data_loss(where + ": element " + std::to_string(i) + " of tensor '" + name + "' at offset " +
                       shape_to_string(dst_offset) + " is held by " + std::to_string(covered[static_cast<size_t>(i)]) +
                       " pieces, expected 1 (the index is inconsistent); resume from an earlier checkpoint");
    }
  }
  if (!whole) std::copy(box.begin() + begin, box.begin() + end, dst);
  return ok_status();
}

}  // namespace piper
