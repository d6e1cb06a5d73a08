// Writing checkpoints (checkpoint.h): pieces deduplicated over ranks, per-rank files, the index last, atomically.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>

#include "piper/base/fault.h"
#include "piper/base/json.h"
#include "piper/runtime/checkpoint/checkpoint.h"
#include "piper/runtime/checkpoint/checkpoint_format.h"
#include "piper/runtime/checkpoint/safetensors.h"

namespace piper {
namespace fs = std::filesystem;
using namespace checkpoint_format;

namespace {

// A piece with its box made explicit.
struct Claim {
  std::string name;
  Shape shape, offset, extent;
  int64_t begin = 0, end = 0;
  bool optimizer = false;
  int rank = 0;
};

Json claim_json(const Claim& c) {
  return Json{{"name", c.name}, {"shape", c.shape},   {"offset", c.offset},      {"extent", c.extent},
              {"begin", c.begin}, {"end", c.end}, {"optimizer", c.optimizer}};
}

Claim claim_from(const Json& j, int rank) {
  Claim c;
  c.name = j["name"].get<std::string>();
  c.shape = j["shape"].get<Shape>();
  c.offset = j["offset"].get<Shape>();
  c.extent = j["extent"].get<Shape>();
  c.begin = j["begin"].get<int64_t>();
  c.end = j["end"].get<int64_t>();
  c.optimizer = j["optimizer"].get<bool>();
  c.rank = rank;
  return c;
}

Status fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return internal_error("cannot open '" + path + "' to fsync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return internal_error("fsync of '" + path + "' failed: " + std::strerror(err) + " (disk full?)");
  return ok_status();
}

Status write_synced(const fs::path& path, const std::string& text) {
  const std::string tmp = path.string() + ".tmp";
  PIPER_RETURN_IF_ERROR(write_text_file(tmp, text));
  PIPER_RETURN_IF_ERROR(fsync_path(tmp));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return internal_error("cannot rename '" + tmp + "' to '" + path.string() + "': " + ec.message());
  return fsync_path(path.parent_path().string());
}

// Every rank's claims, checked for consistency; the winners (one per distinct piece: the lowest rank) in order.
Result<std::vector<Claim>> winners(const std::vector<std::string>& all) {
  std::vector<Claim> out;
  std::map<std::string, size_t> by_id;         // piece identity -> index in out
  std::map<std::string, const Claim*> shapes;  // name -> first claim (its shape and kind)
  std::deque<Claim> claims;
  for (size_t r = 0; r < all.size(); ++r) {
    for (const Json& j : Json::parse(all[r])) claims.push_back(claim_from(j, static_cast<int>(r)));
  }
  for (const Claim& c : claims) {
    auto [it, fresh] = shapes.emplace(c.name, &c);
    if (!fresh && (it->second->shape != c.shape || it->second->optimizer != c.optimizer)) {
      return invalid_argument("checkpoint: rank " + std::to_string(it->second->rank) + " holds tensor '" + c.name +
                              "' as part of shape " + shape_to_string(it->second->shape) + " but rank " +
                              std::to_string(c.rank) + " as part of " + shape_to_string(c.shape) +
                              "; the ranks' Param::global_shape must agree");
    }
    const std::string id = Json{c.name, c.offset, c.extent, c.begin, c.end}.dump();
    if (by_id.emplace(id, out.size()).second) out.push_back(c);
  }
  // Distinct pieces of one tensor must not share an element (replicas are deduplicated above).
  std::map<std::string, std::vector<const Claim*>> per_name;
  for (const Claim& c : out) per_name[c.name].push_back(&c);
  for (const auto& [name, list] : per_name) {
    for (size_t a = 0; a < list.size(); ++a) {
      for (size_t b = a + 1; b < list.size(); ++b) {
        const Claim &x = *list[a], &y = *list[b];
        const bool same_box = x.offset == y.offset && x.extent == y.extent;
        const bool overlap = same_box ? (x.begin < y.end && y.begin < x.end)
                                      : boxes_overlap(x.offset, x.extent, y.offset, y.extent) &&
                                            x.begin < x.end && y.begin < y.end;
        if (overlap) {
          return invalid_argument("checkpoint: ranks " + std::to_string(x.rank) + " and " + std::to_string(y.rank) +
                                  " hold different but overlapping parts of tensor '" + name +
                                  "' (boxes at " + shape_to_string(x.offset) + " and " + shape_to_string(y.offset) +
                                  "); each element must have one owner");
        }
      }
    }
  }
  return out;
}

std::string rank_file(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank-%05d.safetensors", rank);
  return buf;
}

// The index of a checkpoint whose pieces are `pieces` and whose ranks reported `reports` (write_rank_file).
OrderedJson build_index(const CheckpointMeta& meta, const std::vector<Claim>& pieces,
                        const std::vector<std::string>& reports) {
  OrderedJson index;
  index["format"] = kFormat;
  index["version"] = kVersion;
  index["step"] = meta.step;
  index["data_position"] = {{"epoch", meta.data.epoch}, {"index", meta.data.index}};
  index["rng"] = {{"seed", meta.rng.seed}, {"stream", meta.rng.stream}, {"counter", meta.rng.counter}};
  index["seq_len"] = meta.seq_len;
  OrderedJson arch = OrderedJson::object();
  for (const auto& [field, value] : meta.model_arch) arch[field] = OrderedJson::parse(value);
  index["model"] = {{"name", meta.model}, {"arch_hash", architecture_hash(meta.model_arch)}, {"arch", arch}};
  index["strategy"] = meta.strategy;
  index["world_size"] = reports.size();
  if (!meta.expert_placement.empty()) {
    OrderedJson placement = OrderedJson::object();
    for (const auto& [layer, slots] : meta.expert_placement) placement[std::to_string(layer)] = slots;
    index["expert_placement"] = std::move(placement);
  }
  index["files"] = OrderedJson::object();
  std::vector<Json> entries(reports.size());  // per rank: piece key -> [data begin, data end, checksum]
  for (size_t r = 0; r < reports.size(); ++r) {
    if (reports[r].empty()) continue;
    const Json j = Json::parse(reports[r]);
    index["files"][j["file"].get<std::string>()] = {{"bytes", j["bytes"]}, {"fnv1a64", j["fnv1a64"]}};
    entries[r] = j["entries"];
  }
  OrderedJson tensors = OrderedJson::object();
  for (const Claim& c : pieces) {
    if (!tensors.contains(c.name)) {
      tensors[c.name] = {
          {"shape", c.shape}, {"dtype", kDtype}, {"optimizer", c.optimizer}, {"pieces", OrderedJson::array()}};
    }
    if (c.begin == c.end) continue;
    const std::string key = piece_key(c.name, c.shape, c.offset, c.extent, c.begin, c.end);
    const Json& e = entries[static_cast<size_t>(c.rank)][key];
    tensors[c.name]["pieces"].push_back({{"file", rank_file(c.rank)},
                                         {"key", key},
                                         {"offset", c.offset},
                                         {"extent", c.extent},
                                         {"range", {c.begin, c.end}},
                                         {"data_offsets", {e[0], e[1]}},
                                         {"fnv1a64", e[2]}});
  }
  index["tensors"] = std::move(tensors);
  index[kIndexChecksumKey] = index_checksum(Json::parse(index.dump()));
  return index;
}

// Keeps the newest `keep` checkpoints up to `step`; later ones (an abandoned run's) are left alone. Removes
// the .tmp directories of saves that were interrupted (one save runs at a time per ROOT), and .old ones whose
// step directory is complete again.
void rotate(const fs::path& root, int64_t step, int keep) {
  std::error_code ec;
  std::vector<int64_t> steps;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string n = entry.path().filename().string();
    long long s = 0;
    char tail = 0;
    if (std::sscanf(n.c_str(), "step-%lld%c", &s, &tail) == 1 && n == checkpoint_step_name(s) && s <= step) {
      steps.push_back(s);
    } else if (n == checkpoint_step_name(s) + ".tmp" ||
               (n == checkpoint_step_name(s) + ".old" && fs::exists(root / checkpoint_step_name(s) / kIndexFile))) {
      stale.push_back(entry.path());
    }
  }
  for (const fs::path& dir : stale) fs::remove_all(dir, ec);
  std::sort(steps.rbegin(), steps.rend());
  for (size_t i = static_cast<size_t>(std::max(1, keep)); i < steps.size(); ++i) {
    fs::remove_all(root / checkpoint_step_name(steps[i]), ec);
  }
}

// Rank 0, once every rank's file is in `tmp` and synced: the index, then the rename of the directory, then
// `latest`. Until the rename, ROOT/latest and the step directories it names are untouched.
Status commit(const fs::path& root, const fs::path& tmp, const fs::path& final_dir, const CheckpointMeta& meta,
              const std::vector<Claim>& pieces, const std::vector<std::string>& reports, int keep) {
  PIPER_RETURN_IF_ERROR(write_synced(tmp / kIndexFile, build_index(meta, pieces, reports).dump(1) + "\n"));
  PIPER_RETURN_IF_ERROR(fsync_path(tmp.string()));  // the files' directory entries
  // Saving a step again: the complete old directory goes to step-N.old until `latest` is rewritten (a reader
  // falls back to it while step-N is missing); a stale step-N.old goes only once step-N is complete.
  std::error_code ec;
  const fs::path old = final_dir.string() + ".old";
  if (fs::exists(final_dir, ec)) {
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    if (ec) return internal_error("cannot move the previous '" + final_dir.string() + "' aside: " + ec.message());
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) return internal_error("cannot rename '" + tmp.string() + "' to '" + final_dir.string() + "': " + ec.message());
  PIPER_RETURN_IF_ERROR(fsync_path(root.string()));
  PIPER_RETURN_IF_ERROR(write_synced(root / kLatestFile, final_dir.filename().string() + "\n"));
  fs::remove_all(old, ec);
  rotate(root, meta.step, keep);
  return ok_status();
}

}  // namespace

Result<std::vector<std::string>> all_gather_strings(comm::Communicator* world, const std::string& mine,
                                                    double timeout_s) {
  if (world == nullptr) return std::vector<std::string>{mine};
  const size_t n = static_cast<size_t>(world->size());
  const uint64_t len = mine.size();
  std::vector<uint64_t> lens(n);
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, world->all_gather(&len, lens.data(), sizeof(len)));
  PIPER_RETURN_IF_ERROR(world->wait(h, timeout_s));
  const size_t max_len = *std::max_element(lens.begin(), lens.end());
  std::string padded = mine, all(max_len * n, '\0');
  padded.resize(max_len, '\0');
  if (max_len > 0) {
    PIPER_ASSIGN_OR_RETURN(comm::Handle g, world->all_gather(padded.data(), all.data(), max_len));
    PIPER_RETURN_IF_ERROR(world->wait(g, timeout_s));
  }
  std::vector<std::string> out(n);
  for (size_t r = 0; r < n; ++r) out[r] = all.substr(r * max_len, static_cast<size_t>(lens[r]));
  return out;
}

Status agree_on_status(comm::Communicator* world, const Status& mine, double timeout_s) {
  if (world == nullptr) return mine;
  const std::string text = mine.ok() ? "" : std::to_string(static_cast<int>(mine.code())) + "\n" + mine.message();
  Result<std::vector<std::string>> all = all_gather_strings(world, text, timeout_s);
  if (!all.ok()) return mine.ok() ? all.status() : mine;
  for (size_t r = 0; r < all->size(); ++r) {
    const std::string& s = (*all)[r];
    if (s.empty()) continue;
    if (static_cast<int>(r) == world->rank()) return mine;
    const size_t nl = s.find('\n');
    return Status(static_cast<StatusCode>(std::stoi(s.substr(0, nl))), "rank " + std::to_string(r) + ": " +
                  s.substr(nl + 1));
  }
  return ok_status();
}

namespace {

// This rank's pieces as claims (JSON, exchanged between ranks) with their data.
struct LocalClaims {
  Json claims = Json::array();
  std::vector<const float*> data;    // element `begin` of each claim
  std::vector<const Tensor*> boxes;  // the whole box, when `local` is one
};

Status collect_claims(const std::vector<TensorPiece>& pieces, LocalClaims* out) {
  for (const TensorPiece& p : pieces) {
    if (p.local == nullptr) return internal_error("checkpoint: piece of '" + p.name + "' has no tensor");
    Claim c;
    c.name = p.name;
    c.shape = p.global_shape;
    c.offset = p.offset.empty() ? Shape(p.global_shape.size(), 0) : p.offset;
    const bool shard_store = !p.extent.empty();
    c.extent = shard_store ? p.extent : p.local->shape();
    c.begin = p.begin;
    c.end = p.end >= 0 ? p.end : shard_store ? p.begin + p.local->numel() : p.local->numel();
    c.optimizer = p.optimizer;
    PIPER_RETURN_IF_ERROR(check_box(c.name, c.shape, c.offset, c.extent, c.begin, c.end));
    if (shard_store && p.local->numel() != c.end - c.begin) {
      return invalid_argument("checkpoint: tensor '" + p.name + "' holds " + std::to_string(p.local->numel()) +
                              " elements for the range [" + std::to_string(c.begin) + ", " + std::to_string(c.end) +
                              ")");
    }
    out->claims.push_back(claim_json(c));
    out->data.push_back(shard_store ? p.local->data() : p.local->data() + c.begin);
    out->boxes.push_back(shard_store ? nullptr : p.local);
  }
  return ok_status();
}

// Writes the pieces this rank won into tmp/rank-R.safetensors and fsyncs it. Returns the report for the index
// (file, bytes, whole-file checksum, per piece its data_offsets and checksum), or "" when the rank won none.
Result<std::string> write_rank_file(const fs::path& tmp, int rank, const std::vector<Claim>& won,
                                    const LocalClaims& local) {
  std::map<std::string, size_t> local_index;
  for (size_t i = 0; i < local.claims.size(); ++i) local_index[local.claims[i].dump()] = i;
  std::deque<Tensor> ranges;
  std::vector<std::pair<std::string, const Tensor*>> out;
  for (const Claim& c : won) {
    if (c.rank != rank || c.begin == c.end) continue;
    const size_t at = local_index.at(claim_json(c).dump());
    // Whole boxes are written from the tensor itself; ranges are copied out (stored_shape).
    const std::string key = piece_key(c.name, c.shape, c.offset, c.extent, c.begin, c.end);
    const Shape shape = stored_shape(c.extent, c.begin, c.end);
    if (local.boxes[at] != nullptr && shape == c.extent) {
      out.emplace_back(key, local.boxes[at]);
      continue;
    }
    ranges.push_back(Tensor::zeros_or_die(shape, MemCategory::kBuffers));
    std::memcpy(ranges.back().data(), local.data[at], static_cast<size_t>(c.end - c.begin) * sizeof(float));
    out.emplace_back(key, &ranges.back());
  }
  fault_point("ckpt_write");
  if (out.empty()) return std::string();
  const std::string file = rank_file(rank), path = (tmp / file).string();
  PIPER_ASSIGN_OR_RETURN(SafetensorsWritten written, write_safetensors(path, out, {{"format", "pt"}}));
  PIPER_RETURN_IF_ERROR(fsync_path(path));
  Json entries = Json::object();
  for (const SafetensorsEntry& e : written.entries) entries[e.name] = {e.begin, e.end, hex64(e.checksum)};
  return Json{{"file", file}, {"bytes", written.bytes}, {"fnv1a64", hex64(written.file_hash)}, {"entries", entries}}
      .dump();
}

// The placement table the index records: the one every expert-holding rank holds (rank 0 may hold no experts:
// af-pipe's attention ranks). Ranks that hold experts must agree on it.
Result<std::map<int, std::vector<int>>> agreed_placement(const std::map<int, std::vector<int>>& mine,
                                                         comm::Communicator* world, double timeout_s) {
  Json j = Json::object();
  for (const auto& [layer, slots] : mine) j[std::to_string(layer)] = slots;
  PIPER_ASSIGN_OR_RETURN(std::vector<std::string> all, all_gather_strings(world, j.dump(), timeout_s));
  std::string agreed = "{}";
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == "{}") continue;
    if (agreed != "{}" && all[r] != agreed) {
      return internal_error("checkpoint: ranks hold different expert placement tables (rank " + std::to_string(r) +
                            "'s differs from an earlier rank's); please report");
    }
    agreed = all[r];
  }
  std::map<int, std::vector<int>> out;
  const Json table = Json::parse(agreed);
  for (const auto& [layer, slots] : table.items()) out[std::stoi(layer)] = slots.get<std::vector<int>>();
  return out;
}

}  // namespace

// The protocol, every step agreed by all ranks before the next: rank 0 makes an empty ROOT/step-N.tmp; the
// ranks exchange and check their pieces; each writes its file into the .tmp directory; rank 0 commits.
Status save_checkpoint(const std::string& root, const CheckpointMeta& meta, const std::vector<TensorPiece>& pieces,
                       comm::Communicator* world, double timeout_s, int keep) {
  const int rank = world != nullptr ? world->rank() : 0;
  const fs::path root_dir(root), final_dir = root_dir / checkpoint_step_name(meta.step);
  const fs::path tmp = final_dir.string() + ".tmp";
  Status st = ok_status();
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(root_dir, ec);
    if (!ec) fs::remove_all(tmp, ec);  // a save that crashed earlier
    if (!ec) fs::create_directory(tmp, ec);
    if (ec) st = invalid_argument("cannot create checkpoint directory '" + tmp.string() + "': " + ec.message());
  }
  PIPER_RETURN_IF_ERROR(agree_on_status(world, st, timeout_s));

  LocalClaims local;
  PIPER_RETURN_IF_ERROR(agree_on_status(world, collect_claims(pieces, &local), timeout_s));
  PIPER_ASSIGN_OR_RETURN(std::vector<std::string> all, all_gather_strings(world, local.claims.dump(), timeout_s));
  PIPER_ASSIGN_OR_RETURN(std::vector<Claim> won, winners(all));

  Result<std::string> report = write_rank_file(tmp, rank, won, local);
  PIPER_RETURN_IF_ERROR(agree_on_status(world, report.status(), timeout_s));
  PIPER_ASSIGN_OR_RETURN(std::vector<std::string> reports, all_gather_strings(world, *report, timeout_s));
  CheckpointMeta committed = meta;
  Result<std::map<int, std::vector<int>>> placement = agreed_placement(meta.expert_placement, world, timeout_s);
  PIPER_RETURN_IF_ERROR(agree_on_status(world, placement.status(), timeout_s));
  committed.expert_placement = *placement;
  if (rank == 0) st = commit(root_dir, tmp, final_dir, committed, won, reports, keep);
  return agree_on_status(world, st, timeout_s);
}

Status check_checkpoint_root_writable(const std::string& root, comm::Communicator* world, double timeout_s) {
  const int rank = world != nullptr ? world->rank() : 0;
  const fs::path probe = fs::path(root) / (".piper-write-probe-" + std::to_string(rank) + "-" +
                                           std::to_string(static_cast<long long>(::getpid())));
  Status st = ok_status();
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) {
    st = invalid_argument("--save " + root + ": cannot create the directory: " + ec.message() +
                          "; pass a directory you can write to");
  } else {
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
      st = invalid_argument("--save " + root + ": cannot write into the directory: " + std::strerror(errno) +
                            "; pass a directory you can write to");
    } else {
      ::close(fd);
      if (::unlink(probe.c_str()) != 0) {
        st = invalid_argument("--save " + root + ": cannot remove a file from the directory: " + std::strerror(errno) +
                              "; pass a directory you can write to");
      }
    }
  }
  return agree_on_status(world, st, timeout_s);
}

}  // namespace piper
