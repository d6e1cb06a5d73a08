#include "piper/runtime/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "piper/base/check.h"
#include "piper/base/json.h"
#include "piper/runtime/checkpoint/checkpoint_format.h"
#include "piper/runtime/checkpoint/safetensors.h"
#include "piper/spec/model_loader.h"

namespace piper {
namespace {
namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("piper_ckpt_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

Tensor ramp(const Shape& shape, float start) {
  Tensor t = Tensor::zeros_or_die(shape, MemCategory::kParameters);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = start + 0.5f * static_cast<float>(i);
  return t;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(SafetensorsTest, RoundTripAndLayout) {
  const std::string path = temp_dir("st") + "/a.safetensors";
  Tensor a = ramp({2, 3}, 1.0f), b = ramp({4}, -2.0f), scalar = ramp({}, 7.0f), empty = ramp({0, 5}, 0.0f);
  Result<SafetensorsWritten> written =
      write_safetensors(path, {{"w.a", &a}, {"b", &b}, {"s", &scalar}, {"e", &empty}}, {{"format", "pt"}});
  ASSERT_TRUE(written.ok()) << written.status().to_string();
  // The layout is the safetensors spec: u64 LE header length, JSON header padded to 8, then the data.
  const std::string bytes = read_all(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + (6 + 4 + 1) * 4);
  EXPECT_EQ(written->bytes, bytes.size());
  EXPECT_EQ(written->file_hash, fnv1a64(bytes.data(), bytes.size()));
  const Json header = Json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["w.a"]["dtype"], "F32");
  EXPECT_EQ(header["w.a"]["shape"], Json::array({2, 3}));
  EXPECT_EQ(header["b"]["data_offsets"], Json::array({24, 40}));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");

  Result<SafetensorsFile> file = read_safetensors(path, MemCategory::kOptimizer);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  ASSERT_EQ(file->tensors.size(), 4u);
  EXPECT_EQ(file->tensors[0].first, "w.a");
  EXPECT_EQ(file->tensors[1].second.shape(), (Shape{4}));
  EXPECT_EQ(file->tensors[1].second[3], -0.5f);
  EXPECT_EQ(file->tensors[2].second[0], 7.0f);
  EXPECT_EQ(file->tensors[0].second.category(), MemCategory::kOptimizer);
  EXPECT_EQ(file->file_hash, written->file_hash);
  EXPECT_EQ(file->metadata.at("format"), "pt");
  // Each entry's checksum covers its header entry and its data, the same written and read.
  ASSERT_EQ(file->entries.size(), 4u);
  ASSERT_EQ(written->entries.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(file->entries[i].name, written->entries[i].name);
    EXPECT_EQ(file->entries[i].checksum, written->entries[i].checksum) << file->entries[i].name;
  }
  EXPECT_EQ(file->entries[1].begin, 24u);
  // The same data under a transposed shape, or other offsets, sums differently.
  const uint64_t sum = safetensors_entry_checksum("w.a", "F32", {2, 3}, 0, 24, a.data());
  EXPECT_EQ(sum, written->entries[0].checksum);
  EXPECT_NE(sum, safetensors_entry_checksum("w.a", "F32", {3, 2}, 0, 24, a.data()));
  EXPECT_NE(sum, safetensors_entry_checksum("w.b", "F32", {2, 3}, 0, 24, a.data()));
  EXPECT_NE(sum, safetensors_entry_checksum("w.a", "F32", {2, 3}, 8, 32, a.data()));
}

// Every corruption of a valid file must give DataLoss naming the file, never a crash.
TEST(SafetensorsTest, CorruptFilesAreDataLoss) {
  const std::string dir = temp_dir("corrupt");
  const std::string good = dir + "/good.safetensors";
  Tensor a = ramp({3, 3}, 1.0f);
  ASSERT_TRUE(write_safetensors(good, {{"a", &a}}, {}).ok());
  const std::string bytes = read_all(good);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  const std::string header = bytes.substr(8, n);
  auto with_header = [&](std::string h) {
    h.append((8 - h.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(h.size()) >> (8 * i));
    return out + h + bytes.substr(8 + n);
  };
  std::string huge_len = bytes;
  huge_len[7] = '\x7f';
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"empty", ""},
      {"short", bytes.substr(0, 5)},
      {"truncated data", bytes.substr(0, bytes.size() - 3)},
      {"truncated header", bytes.substr(0, 8 + n / 2)},
      {"huge header length", huge_len},
      {"trailing bytes", bytes + "xyzw"},
      {"not json", with_header("{\"a\": [nope")},
      {"not an object", with_header("[1, 2]")},
      {"missing offsets", with_header(R"({"a":{"dtype":"F32","shape":[3,3]}})")},
      {"wrong byte count", with_header(R"({"a":{"dtype":"F32","shape":[3,3],"data_offsets":[0,32]}})")},
      {"negative shape", with_header(R"({"a":{"dtype":"F32","shape":[-3,3],"data_offsets":[0,36]}})")},
      {"reversed offsets", with_header(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[36,0]}})")},
      {"past the end", with_header(R"({"a":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]}})")},
      {"hole", with_header(R"({"a":{"dtype":"F32","shape":[2,4],"data_offsets":[4,36]}})")},
  };
  for (const auto& [what, content] : cases) {
    const std::string path = dir + "/bad.safetensors";
    write_all(path, content);
    Result<SafetensorsFile> r = read_safetensors(path, MemCategory::kBuffers);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << what << ": " << r.status().to_string();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << what;
  }
  write_all(dir + "/f16.safetensors", with_header(R"({"a":{"dtype":"F16","shape":[18],"data_offsets":[0,36]}})"));
  EXPECT_EQ(read_safetensors(dir + "/f16.safetensors", MemCategory::kBuffers).status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(read_safetensors(dir + "/missing.safetensors", MemCategory::kBuffers).status().code(),
            StatusCode::kNotFound);
}

std::map<std::string, std::string> tiny_arch() { return model_architecture(load_model("tiny-moe").value()); }

// A one-rank checkpoint of two parameters and the moments of one, at step 42.
struct Saved {
  std::string root;
  Tensor w1 = ramp({4, 3}, 0.0f), w2 = ramp({5}, 10.0f), m1 = ramp({4, 3}, -1.0f), v1 = ramp({4, 3}, 2.0f);
  CheckpointMeta meta{42, {3, 17}, {0xfeedfacecafebeefull, 1, 99}, 16, "tiny", "dp=1", 1, {}, tiny_arch()};
  explicit Saved(const std::string& name, int64_t step = 42) : root(temp_dir(name)) {
    meta.step = step;
    PIPER_CHECK_OK(save(step));
  }
  Status save(int64_t step) {
    meta.step = step;
    return save_checkpoint(root, meta,
                           {{"layer0.w", {4, 3}, {}, &w1},
                            {"head.w", {5}, {}, &w2},
                            {"layer0.w.m", {4, 3}, {}, &m1, 0, -1, true},
                            {"layer0.w.v", {4, 3}, {}, &v1, 0, -1, true}},
                           nullptr, 1.0);
  }
  std::string file() const { return root + "/" + checkpoint_step_name(meta.step) + "/rank-00000.safetensors"; }
};

Status restore_all(const std::string& root);

TEST(CheckpointTest, RoundTripThroughLatest) {
  Saved s("roundtrip");
  EXPECT_EQ(read_all(s.root + "/latest"), "step-00000042\n");
  auto r = CheckpointReader::open(s.root);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const CheckpointMeta& m = (*r)->meta();
  EXPECT_EQ(m.step, 42);
  EXPECT_EQ(m.data.epoch, 3);
  EXPECT_EQ(m.data.index, 17);
  EXPECT_EQ(m.rng.seed, 0xfeedfacecafebeefull);
  EXPECT_EQ(m.rng.counter, 99u);
  EXPECT_EQ(m.seq_len, 16);
  EXPECT_EQ(m.model, "tiny");
  EXPECT_EQ(m.strategy, "dp=1");
  ASSERT_EQ((*r)->tensors().size(), 4u);
  EXPECT_TRUE((*r)->tensors().at("layer0.w.m").optimizer);
  Tensor w1 = Tensor::zeros_or_die({4, 3}, MemCategory::kParameters);
  ASSERT_TRUE((*r)->restore("layer0.w", {4, 3}, {}, &w1).ok());
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(w1[i], s.w1[i]);
  // A box of a whole tensor: rows 1..2, columns 1..2.
  Tensor box = Tensor::zeros_or_die({2, 2}, MemCategory::kOptimizer);
  ASSERT_TRUE((*r)->restore("layer0.w.v", {4, 3}, {1, 1}, &box).ok());
  EXPECT_EQ(box[0], s.v1[4]);
  EXPECT_EQ(box[3], s.v1[8]);
  Tensor wrong = Tensor::zeros_or_die({3, 4}, MemCategory::kParameters);
  EXPECT_EQ((*r)->restore("layer0.w", {3, 4}, {}, &wrong).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*r)->restore("nope", {3, 4}, {}, &wrong).code(), StatusCode::kInvalidArgument);
  // The step directory itself is a checkpoint too.
  auto direct = CheckpointReader::open(s.root + "/step-00000042");
  ASSERT_TRUE(direct.ok()) << direct.status().to_string();
  EXPECT_EQ((*direct)->meta().step, 42);
}

// The expert placement table (expert-parallel writers) round-trips through the index; a malformed one is
// DataLoss naming the index; a checkpoint without one reads back an empty table.
TEST(CheckpointTest, ExpertPlacementRoundTrips) {
  const std::string root = temp_dir("placement");
  Tensor w = ramp({4, 2}, 0.0f);
  CheckpointMeta meta{5, {}, {}, 8, "tiny", "ep=2", 2, {}, {}};
  meta.expert_placement = {{1, {2, 0, 3, 1}}, {3, {0, 1, 2, 3}}};
  ASSERT_TRUE(save_checkpoint(root, meta, {{"e.w", {4, 2}, {}, &w}}, nullptr, 1.0).ok());
  auto r = CheckpointReader::open(root);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->meta().expert_placement, meta.expert_placement);
  const std::string index = root + "/step-00000005/index.json";
  const std::string text = read_all(index);
  const size_t at = text.find("\"expert_placement\"");
  ASSERT_NE(at, std::string::npos) << text;
  std::string bad = text;
  bad.replace(bad.find("\"1\"", at), 3, "\"x\"");
  write_all(index, bad);
  auto broken = CheckpointReader::open(root);
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(broken.status().message().find("expert_placement.x"), std::string::npos) << broken.status().message();

  const std::string plain = temp_dir("no_placement");
  meta.expert_placement.clear();
  ASSERT_TRUE(save_checkpoint(plain, meta, {{"e.w", {4, 2}, {}, &w}}, nullptr, 1.0).ok());
  auto none = CheckpointReader::open(plain);
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_TRUE((*none)->meta().expert_placement.empty());
  EXPECT_EQ(read_all(plain + "/step-00000005/index.json").find("expert_placement"), std::string::npos);
}

// A tensor written as pieces (two row blocks, the second as two ZeRO ranges) reads back as any other box.
TEST(CheckpointTest, PiecesAssembleIntoAnyBox) {
  const std::string root = temp_dir("pieces");
  Tensor full = ramp({4, 6}, 0.0f);
  Tensor top = ramp({2, 6}, 0.0f), bottom = ramp({2, 6}, 6.0f);
  CheckpointMeta meta{3, {}, {}, 8, "tiny", "ep=2", 2, {}, {}};
  ASSERT_TRUE(save_checkpoint(root, meta,
                              {{"e.w", {4, 6}, {0, 0}, &top},
                               {"e.w", {4, 6}, {2, 0}, &bottom, 0, 5},
                               {"e.w", {4, 6}, {2, 0}, &bottom, 5, 12},
                               {"e.w", {4, 6}, {0, 0}, &top}},  // a replica: written once
                              nullptr, 1.0)
                  .ok());
  auto r = CheckpointReader::open(root);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->tensors().at("e.w").pieces.size(), 3u);
  for (const auto& [offset, extent] :
       std::vector<std::pair<Shape, Shape>>{{{0, 0}, {4, 6}}, {{0, 3}, {4, 3}}, {{1, 2}, {2, 3}}, {{3, 0}, {1, 6}}}) {
    Tensor dst = Tensor::zeros_or_die(extent, MemCategory::kParameters);
    ASSERT_TRUE((*r)->restore("e.w", {4, 6}, offset, &dst).ok()) << shape_to_string(offset);
    for (int64_t i = 0; i < extent[0]; ++i) {
      for (int64_t j = 0; j < extent[1]; ++j) {
        EXPECT_EQ(dst[i * extent[1] + j], full[(offset[0] + i) * 6 + offset[1] + j]) << shape_to_string(offset);
      }
    }
  }
  Tensor outside = Tensor::zeros_or_die({2, 6}, MemCategory::kParameters);
  EXPECT_EQ((*r)->restore("e.w", {4, 6}, {3, 0}, &outside).code(), StatusCode::kInvalidArgument);

  // Overlapping different pieces, a box outside its tensor, ranks disagreeing on the shape: InvalidArgument.
  Status s =
      save_checkpoint(root, meta, {{"e.w", {4, 6}, {0, 0}, &top}, {"e.w", {4, 6}, {1, 0}, &bottom}}, nullptr, 1.0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlapping"), std::string::npos) << s.message();
  s = save_checkpoint(root, meta, {{"e.w", {4, 6}, {3, 0}, &top}}, nullptr, 1.0);
  EXPECT_NE(s.message().find("outside"), std::string::npos) << s.message();
  s = save_checkpoint(root, meta, {{"e.w", {4, 6}, {0, 0}, &top}, {"e.w", {5, 6}, {2, 0}, &bottom}}, nullptr, 1.0);
  EXPECT_NE(s.message().find("global_shape"), std::string::npos) << s.message();

  // A gap (rows 2..3 missing): restoring them is DataLoss, not zeros.
  meta.step = 4;
  ASSERT_TRUE(save_checkpoint(root, meta, {{"e.w", {4, 6}, {0, 0}, &top}}, nullptr, 1.0).ok());
  auto gap = CheckpointReader::open(root);
  ASSERT_TRUE(gap.ok());
  Tensor dst = Tensor::zeros_or_die({4, 6}, MemCategory::kParameters);
  s = (*gap)->restore("e.w", {4, 6}, {}, &dst);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.to_string();
}

// Stores that hold only their range (ZeRO moments allocated for the shard): written and read back by range.
TEST(CheckpointTest, ShardStoresWriteAndReadRanges) {
  const std::string root = temp_dir("shard_store");
  Tensor full = ramp({4, 6}, 0.0f), lo = ramp({10}, 0.0f), hi = ramp({14}, 5.0f);
  CheckpointMeta meta{1, {}, {}, 8, "tiny", "dp=2,zero=1", 2, {}, {}};
  ASSERT_TRUE(
      save_checkpoint(root, meta,
                      {{"w.m", {4, 6}, {}, &lo, 0, 10, true, {4, 6}}, {"w.m", {4, 6}, {}, &hi, 10, 24, true, {4, 6}}},
                      nullptr, 1.0)
          .ok());
  auto r = CheckpointReader::open(root);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Tensor whole = Tensor::zeros_or_die({4, 6}, MemCategory::kOptimizer);
  ASSERT_TRUE((*r)->restore("w.m", {4, 6}, {}, &whole).ok());
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(whole[i], full[i]) << i;
  std::vector<float> part(12);
  ASSERT_TRUE((*r)->restore_range("w.m", {4, 6}, {}, {4, 6}, 5, 17, part.data()).ok());
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(part[static_cast<size_t>(i)], full[5 + i]) << i;
  Status s = save_checkpoint(root, meta, {{"w.m", {4, 6}, {}, &lo, 0, 12, true, {4, 6}}}, nullptr, 1.0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
}

// A save that dies half-way leaves the previous checkpoint readable; the next save cleans up; keep = 2.
TEST(CheckpointTest, InterruptedSaveKeepsThePreviousCheckpoint) {
  Saved s("atomic", 1);
  fs::create_directories(s.root + "/step-00000002.tmp");
  write_all(s.root + "/step-00000002.tmp/rank-00000.safetensors", "half");
  auto r = CheckpointReader::open(s.root);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->meta().step, 1);
  fs::create_directories(s.root + "/step-00000007.tmp");  // another step's interrupted save
  ASSERT_TRUE(s.save(2).ok());
  EXPECT_FALSE(fs::exists(s.root + "/step-00000002.tmp"));
  EXPECT_FALSE(fs::exists(s.root + "/step-00000007.tmp"));
  ASSERT_TRUE(s.save(3).ok());
  EXPECT_FALSE(fs::exists(s.root + "/step-00000001"));
  EXPECT_TRUE(fs::exists(s.root + "/step-00000002/index.json"));
  EXPECT_EQ(read_all(s.root + "/latest"), "step-00000003\n");
  ASSERT_TRUE(s.save(3).ok());  // the same step again replaces it
  EXPECT_EQ(CheckpointReader::open(s.root).value()->meta().step, 3);
  // A crash while saving step 3 again, between moving the old step-3 aside and renaming the new one in.
  fs::rename(s.root + "/step-00000003", s.root + "/step-00000003.old");
  auto r3 = CheckpointReader::open(s.root);
  ASSERT_TRUE(r3.ok()) << r3.status().to_string();
  EXPECT_EQ((*r3)->meta().step, 3);
  EXPECT_TRUE(restore_all(s.root).ok());
  ASSERT_TRUE(s.save(3).ok());
  EXPECT_FALSE(fs::exists(s.root + "/step-00000003.old"));
  EXPECT_TRUE(fs::exists(s.root + "/step-00000003/index.json"));
  // Such a leftover of another step goes with the next save once its step directory is complete.
  fs::create_directories(s.root + "/step-00000002.old");
  ASSERT_TRUE(s.save(4).ok());
  EXPECT_FALSE(fs::exists(s.root + "/step-00000002.old"));
}

// Reads every tensor of a Saved checkpoint back, as a resume does.
Status restore_all(const std::string& root) {
  PIPER_ASSIGN_OR_RETURN(auto r, CheckpointReader::open(root));
  Tensor w = Tensor::zeros_or_die({4, 3}, MemCategory::kParameters);
  Tensor h = Tensor::zeros_or_die({5}, MemCategory::kParameters);
  PIPER_RETURN_IF_ERROR(r->restore("layer0.w", {4, 3}, {}, &w));
  PIPER_RETURN_IF_ERROR(r->restore("layer0.w.m", {4, 3}, {}, &w));
  PIPER_RETURN_IF_ERROR(r->restore("layer0.w.v", {4, 3}, {}, &w));
  return r->restore("head.w", {5}, {}, &h);
}

// `st` has `code` and a message containing every one of `parts`, and (not a model mismatch) no "another model".
void expect_refused(const Status& st, StatusCode code, const std::vector<std::string>& parts) {
  EXPECT_EQ(st.code(), code) << st.to_string();
  for (const std::string& part : parts) {
    EXPECT_NE(st.message().find(part), std::string::npos) << part << " in\n" << st.message();
  }
  EXPECT_EQ(st.message().find("another model"), std::string::npos) << st.message();
}

// The safetensors header of a Saved file, edited by `edit` (same length, so the layout stays valid).
void edit_header(const std::string& file, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string bytes = read_all(file);
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  ASSERT_LT(at, 8 + bytes.size() / 2);
  bytes.replace(at, from.size(), to);
  write_all(file, bytes);
}

std::string index_path(const Saved& s) { return s.root + "/" + checkpoint_step_name(s.meta.step) + "/index.json"; }

// Rewrites the index through `edit`, its checksum left as it was (a careless edit) or resealed (a careful one,
// to show the check that comes before the checksum).
void edit_index(const Saved& s, const std::function<void(Json&)>& edit, bool reseal) {
  Json index = Json::parse(read_all(index_path(s)));
  edit(index);
  if (reseal) index["index_fnv1a64"] = checkpoint_format::index_checksum(index);
  write_all(index_path(s), index.dump(1));
}
void edit_and_reseal_index(const Saved& s, const std::function<void(Json&)>& edit) { edit_index(s, edit, true); }
void edit_index_only(const Saved& s, const std::function<void(Json&)>& edit) { edit_index(s, edit, false); }

TEST(CheckpointRefuses, TransposedShapeInTheFileHeader) {
  Saved s("transposed");
  edit_header(s.file(), R"("layer0.w":{"dtype":"F32","shape":[4,3])", R"("layer0.w":{"dtype":"F32","shape":[3,4])");
  expect_refused(restore_all(s.root), StatusCode::kDataLoss,
                 {"rank-00000.safetensors", "tensor 'layer0.w' has shape [3, 4] in its header, the index says [4, 3]"});
}

TEST(CheckpointRefuses, BitFlipInTheData) {
  Saved s("flip_data");
  std::string bytes = read_all(s.file());
  bytes[bytes.size() - 5] ^= 0x10;  // in the last tensor of the file
  write_all(s.file(), bytes);
  expect_refused(restore_all(s.root), StatusCode::kDataLoss,
                 {"rank-00000.safetensors", "tensor 'layer0.w.v' does not match its checksum", "earlier checkpoint"});
}

TEST(CheckpointRefuses, BitFlipInTheHeader) {
  {
    Saved s("flip_name");  // 'w' ^ 1 = 'v': a tensor the index does not list
    edit_header(s.file(), R"("head.w")", R"("head.v")");
    expect_refused(restore_all(s.root), StatusCode::kDataLoss, {"holds tensor 'head.v' that the index does not list"});
  }
  {
    Saved s("flip_metadata");  // "pt" -> "pu": only the whole-file checksum covers the metadata
    edit_header(s.file(), R"("format":"pt")", R"("format":"pu")");
    expect_refused(restore_all(s.root), StatusCode::kDataLoss,
                   {"rank-00000.safetensors", "whole file does not match its checksum"});
  }
  {
    Saved s("flip_json");  // not JSON any more
    edit_header(s.file(), R"({"__metadata__")", R"(["__metadata__")");
    expect_refused(restore_all(s.root), StatusCode::kDataLoss, {"rank-00000.safetensors", "not valid JSON"});
  }
}

TEST(CheckpointRefuses, TruncatedOrMissingFile) {
  {
    Saved s("truncate");
    const std::string bytes = read_all(s.file());
    write_all(s.file(), bytes.substr(0, bytes.size() - 8));
    const std::string sizes =
        "has " + std::to_string(bytes.size() - 8) + " bytes but the index says " + std::to_string(bytes.size());
    expect_refused(restore_all(s.root), StatusCode::kDataLoss, {"rank-00000.safetensors", sizes, "truncated"});
  }
  {
    Saved s("missing");
    fs::remove(s.file());
    expect_refused(restore_all(s.root), StatusCode::kDataLoss, {"rank-00000.safetensors", "is missing"});
  }
}

TEST(CheckpointRefuses, EditedStep) {
  {
    Saved s("step_huge");
    edit_and_reseal_index(s, [](Json& j) { j["step"] = 1e15; });
    expect_refused(restore_all(s.root), StatusCode::kDataLoss,
                   {"index.json", "step must be an integer in [0, 1000000000000], got 1e+15"});
  }
  {
    Saved s("step_negative");
    edit_and_reseal_index(s, [](Json& j) { j["step"] = -3; });
    expect_refused(restore_all(s.root), StatusCode::kDataLoss, {"step must be an integer", "got -3"});
  }
  {
    Saved s("step_other_dir");
    edit_and_reseal_index(s, [](Json& j) { j["step"] = 41; });
    expect_refused(restore_all(s.root), StatusCode::kDataLoss, {"step is 41 but the directory is 'step-00000042'"});
  }
  {
    Saved s("step_resealed_not");  // a plausible step, in a directory of another name: the index checksum
    fs::rename(s.root + "/step-00000042", s.root + "/copy");
    const std::string index = s.root + "/copy/index.json";
    Json j = Json::parse(read_all(index));
    j["step"] = 7;
    write_all(index, j.dump(1));
    expect_refused(restore_all(s.root + "/copy"), StatusCode::kDataLoss,
                   {"copy/index.json", "do not match its index_fnv1a64", "edited or damaged"});
  }
}

TEST(CheckpointRefuses, EditedModelKeysAndVersion) {
  {
    Saved s("model_name");  // a valid name, not the one written: the index checksum
    edit_index_only(s, [](Json& j) { j["model"]["name"] = "mixtral-8x7b"; });
    expect_refused(restore_all(s.root), StatusCode::kDataLoss, {"index.json", "do not match its index_fnv1a64"});
  }
  {
    Saved s("model_string");  // version 2's form
    edit_and_reseal_index(s, [](Json& j) { j["model"] = "mixtral-8x7b"; });
    expect_refused(restore_all(s.root), StatusCode::kDataLoss, {"model is not a JSON object"});
  }
  {
    Saved s("model_arch");  // the fields edited, not their hash
    edit_and_reseal_index(s, [](Json& j) { j["model"]["arch"]["num_layers"] = 32; });
    expect_refused(restore_all(s.root), StatusCode::kDataLoss, {"model.arch_hash", "does not match model.arch"});
  }
  {
    Saved s("unknown_key");
    edit_and_reseal_index(s, [](Json& j) { j["stpe"] = 3; });
    expect_refused(restore_all(s.root), StatusCode::kDataLoss, {"the index has the unknown key 'stpe'"});
  }
  {
    Saved s("missing_key");
    edit_and_reseal_index(s, [](Json& j) { j.erase("seq_len"); });
    expect_refused(restore_all(s.root), StatusCode::kDataLoss, {"the index lacks the key 'seq_len'"});
  }
  {
    Saved s("dtype");
    edit_and_reseal_index(s, [](Json& j) { j["tensors"]["head.w"]["dtype"] = "BF16"; });
    expect_refused(restore_all(s.root), StatusCode::kUnimplemented, {"tensor 'head.w' has dtype BF16", "F32"});
  }
  {
    Saved s("old_version");
    edit_index_only(s, [](Json& j) { j["version"] = 2; });
    expect_refused(restore_all(s.root), StatusCode::kUnimplemented,
                   {"format version 2; this build reads version 3 only", "without --resume"});
  }
}

TEST(CheckpointRefuses, BrokenPointerOrNoCheckpoint) {
  Saved s("pointer");
  write_all(s.root + "/latest", "step-00000007\n");
  expect_refused(restore_all(s.root), StatusCode::kDataLoss, {"latest", "step-00000007"});
  Status st = restore_all(temp_dir("nothing"));
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("nothing"), std::string::npos);
}

// Damage anywhere in the index or the rank file (deterministic byte flips, cuts and inserted digits): every
// open + restore ends in OK or a DataLoss/Unimplemented/NotFound naming the damaged file, never a crash;
// and OK only when the checksums could not have seen the change (the file is byte for byte the original).
TEST(CheckpointRefuses, RandomDamageIsRefusedOrHarmless) {
  Saved s("random");
  const std::string index = index_path(s), file = s.file();
  const std::string index_bytes = read_all(index), file_bytes = read_all(file);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&](uint64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % n;
  };
  int refused = 0, harmless = 0;
  for (int i = 0; i < 400; ++i) {
    const bool in_index = i % 2 == 0;
    std::string bytes = in_index ? index_bytes : file_bytes;
    const size_t at = static_cast<size_t>(next(bytes.size()));
    switch (next(3)) {
      case 0:
        bytes[at] = static_cast<char>(bytes[at] ^ (1 << next(8)));
        break;
      case 1:
        bytes.resize(at);
        break;
      default:
        bytes.insert(at, "9");
        break;
    }
    write_all(in_index ? index : file, bytes);
    const Status st = restore_all(s.root);
    write_all(in_index ? index : file, in_index ? index_bytes : file_bytes);
    if (st.ok()) {
      // Only insignificant index whitespace can change without a refusal.
      ++harmless;
      EXPECT_TRUE(in_index) << "a damaged rank file loaded (iteration " << i << ")";
      if (in_index) {
        EXPECT_EQ(Json::parse(bytes), Json::parse(index_bytes)) << i;
      }
      continue;
    }
    ++refused;
    EXPECT_TRUE(st.code() == StatusCode::kDataLoss || st.code() == StatusCode::kUnimplemented ||
                st.code() == StatusCode::kNotFound)
        << st.to_string();
    EXPECT_TRUE(st.message().find("index.json") != std::string::npos ||
                st.message().find("rank-00000.safetensors") != std::string::npos)
        << st.message();
    EXPECT_EQ(st.message().find("another model"), std::string::npos) << st.message();
  }
  EXPECT_GT(refused, 350);
  std::printf("400 damaged checkpoints: %d refused, %d harmless (index whitespace)\n", refused, harmless);
}

// Only a real model mismatch says "written for another model", with the fields that differ.
TEST(CheckpointModel, AnotherArchitectureIsRefusedNamingTheFields) {
  Saved s("model");
  auto r = CheckpointReader::open(s.root);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ModelSpec tiny = load_model("tiny-moe").value();
  EXPECT_TRUE(check_checkpoint_model((*r)->dir(), (*r)->meta(), tiny).ok());
  ModelSpec renamed = tiny;  // the same architecture under another name loads
  renamed.name = "my-tiny";
  renamed.moe.top_k = 1;  // not a shape
  EXPECT_TRUE(check_checkpoint_model((*r)->dir(), (*r)->meta(), renamed).ok());
  ModelSpec other = tiny;
  other.name = "bigger";
  other.num_layers = 6;
  other.hidden_size = 256;
  Status st = check_checkpoint_model((*r)->dir(), (*r)->meta(), other);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  for (const std::string part : {"was written for another model: 'tiny'", "this run trains 'bigger'",
                                 "hidden_size 128 vs 256", "num_layers 4 vs 6", "resume with --model tiny"}) {
    EXPECT_NE(st.message().find(part), std::string::npos) << part << " in\n" << st.message();
  }
  EXPECT_NE(model_architecture(tiny), model_architecture(other));
  EXPECT_EQ(architecture_hash(model_architecture(tiny)), architecture_hash(model_architecture(renamed)));
}

TEST(CheckpointRoot, UnwritableRootIsNamedWithTheReason) {
  const std::string dir = temp_dir("probe");
  const std::string fresh = dir + "/a/b";
  ASSERT_TRUE(check_checkpoint_root_writable(fresh, nullptr, 1.0).ok());
  EXPECT_TRUE(fs::is_directory(fresh));
  EXPECT_TRUE(fs::is_empty(fresh));  // the probe is gone
  write_all(dir + "/file", "x");
  Status st = check_checkpoint_root_writable(dir + "/file/ckpt", nullptr, 1.0);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--save " + dir + "/file/ckpt: cannot create the directory"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("Not a directory"), std::string::npos) << st.message();
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(dir + "/ro");
    fs::permissions(dir + "/ro", fs::perms::owner_read | fs::perms::owner_exec);
    st = check_checkpoint_root_writable(dir + "/ro", nullptr, 1.0);
    EXPECT_NE(st.message().find("cannot write into the directory: Permission denied"), std::string::npos)
        << st.message();
    fs::permissions(dir + "/ro", fs::perms::owner_all);
  }
}

}  // namespace
}  // namespace piper
