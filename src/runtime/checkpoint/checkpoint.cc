// Reading checkpoints (checkpoint.h); writing is checkpoint_save.cc.
#include "piper/runtime/checkpoint/checkpoint.h"

#include <algorithm>
#include <filesystem>

#include "piper/base/json.h"
#include "piper/base/strings.h"
#include "piper/runtime/checkpoint/checkpoint_format.h"
#include "piper/runtime/checkpoint/safetensors.h"

namespace piper {
namespace fs = std::filesystem;
using namespace checkpoint_format;

namespace {

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
  // Saving the step `latest` names again moves the old directory to step-N.old before renaming the new one in;
  // a crash between the two renames leaves the old one there, complete.
  const fs::path old = fs::path(root) / (name + ".old");
  if (!fs::exists(dir / kIndexFile, ec) && fs::exists(old / kIndexFile, ec)) return old.string();
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
  fs::path name = fs::path(dir).lexically_normal();
  if (!name.has_filename()) name = name.parent_path();  // "ROOT/step-00000012/"
  PIPER_ASSIGN_OR_RETURN(Index index, parse_index(text, path, name.filename().string()));
  auto r = std::unique_ptr<CheckpointReader>(new CheckpointReader());
  r->dir_ = dir;
  r->meta_ = std::move(index.meta);
  r->tensors_ = std::move(index.tensors);
  r->files_ = std::move(index.files);
  return r;
}

namespace {

// The header entry of piece `p` in file `path` must be what the index recorded, and its checksum (entry + data).
Status check_entry(const std::string& path, const CheckpointReader::PieceRef& p, const SafetensorsEntry& e) {
  const std::string what = "checkpoint file '" + path + "': tensor '" + p.key + "' ";
  const std::string fix = " (the file was edited or damaged after it was written); resume from an earlier checkpoint";
  const Shape shape = stored_shape(p.extent, p.begin, p.end);
  if (e.dtype != kDtype) {
    return data_loss(what + "has dtype " + e.dtype + " in its header, the index says " + kDtype + fix);
  }
  if (e.shape != shape) {
    return data_loss(what + "has shape " + shape_to_string(e.shape) + " in its header, the index says " +
                     shape_to_string(shape) + fix);
  }
  if (e.begin != p.data_begin || e.end != p.data_end) {
    return data_loss(what + "has data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                     "] in its header, the index says [" + std::to_string(p.data_begin) + ", " +
                     std::to_string(p.data_end) + "]" + fix);
  }
  if (hex64(e.checksum) != p.checksum) {
    return data_loss(what + "does not match its checksum: the index says " + p.checksum +
                     ", its header entry and data give " + hex64(e.checksum) +
                     " (a flipped bit or an overwrite); resume from an earlier checkpoint");
  }
  return ok_status();
}

}  // namespace

Result<const Tensor*> CheckpointReader::piece_data(const PieceRef& piece, bool optimizer) {
  auto loaded = loaded_.find(piece.file);
  if (loaded == loaded_.end()) {
    const std::string path = (fs::path(dir_) / piece.file).string();
    const FileInfo& info = files_.at(piece.file);
    std::error_code ec;
    const uintmax_t actual = fs::file_size(path, ec);
    if (ec) {
      return data_loss("checkpoint file '" + path + "' listed in the index is missing: " + ec.message() +
                       " (deleted or not copied with the index); resume from an earlier checkpoint");
    }
    if (actual != info.bytes) {
      return data_loss("checkpoint file '" + path + "' has " + std::to_string(actual) + " bytes but the index says " +
                       std::to_string(info.bytes) + " (truncated or overwritten); resume from an earlier checkpoint");
    }
    PIPER_ASSIGN_OR_RETURN(SafetensorsFile st, read_safetensors(path, optimizer ? MemCategory::kOptimizer
                                                                               : MemCategory::kParameters));
    std::map<std::string, const PieceRef*> listed;
    for (const auto& [name, t] : tensors_) {
      for (const PieceRef& p : t.pieces) {
        if (p.file == piece.file) listed[p.key] = &p;
      }
    }
    std::map<std::string, Tensor> tensors;
    for (size_t i = 0; i < st.tensors.size(); ++i) {
      const std::string& key = st.tensors[i].first;
      auto ref = listed.find(key);
      if (ref == listed.end()) {
        return data_loss("checkpoint file '" + path + "' holds tensor '" + key + "' that the index does not list " +
                         "(the header was edited or damaged); resume from an earlier checkpoint");
      }
      PIPER_RETURN_IF_ERROR(check_entry(path, *ref->second, st.entries[i]));
      tensors.emplace(key, std::move(st.tensors[i].second));
    }
    for (const auto& [key, ref] : listed) {
      if (!tensors.count(key)) {
        return data_loss("checkpoint file '" + path + "' lacks tensor '" + key + "' that the index lists " +
                         "(the header was edited or damaged); resume from an earlier checkpoint");
      }
    }
    if (hex64(st.file_hash) != info.checksum) {
      return data_loss("checkpoint file '" + path + "': its tensors match the index but the whole file does not " +
                       "match its checksum (index " + info.checksum + ", file " + hex64(st.file_hash) +
                       "): its header's metadata or padding changed; resume from an earlier checkpoint");
    }
    loaded = loaded_.emplace(piece.file, std::move(tensors)).first;
  }
  return &loaded->second.at(piece.key);
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
    return invalid_argument(where + " (model '" + meta_.model + "') has no tensor '" + name +
                            "'; resume with a model whose tensors it holds");
  }
  const TensorInfo& info = it->second;
  if (info.shape != global_shape) {
    return invalid_argument(where + " (model '" + meta_.model + "'): tensor '" + name + "' has shape " +
                            shape_to_string(info.shape) + ", expected " + shape_to_string(global_shape) +
                            "; resume with a model of the checkpoint's shapes");
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
