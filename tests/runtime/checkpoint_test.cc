#include "piper/runtime/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "piper/base/check.h"
#include "piper/base/json.h"
#include "piper/runtime/safetensors.h"

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
  Result<uint64_t> hash =
      write_safetensors(path, {{"w.a", &a}, {"b", &b}, {"s", &scalar}, {"e", &empty}}, {{"format", "pt"}});
  ASSERT_TRUE(hash.ok()) << hash.status().to_string();
  // The layout is the safetensors spec: u64 LE header length, JSON header padded to 8, then the data.
  const std::string bytes = read_all(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + (6 + 4 + 1) * 4);
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
  EXPECT_EQ(file->data_hash, *hash);
  EXPECT_EQ(file->metadata.at("format"), "pt");
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

// A one-rank checkpoint of two parameters and the moments of one, at step 42.
struct Saved {
  std::string root;
  Tensor w1 = ramp({4, 3}, 0.0f), w2 = ramp({5}, 10.0f), m1 = ramp({4, 3}, -1.0f), v1 = ramp({4, 3}, 2.0f);
  CheckpointMeta meta{42, {3, 17}, {0xfeedfacecafebeefull, 1, 99}, 16, "tiny", "dp=1", 1, {}};
  explicit Saved(const std::string& name, int64_t step = 42) : root(temp_dir(name)) {
    meta.step = step;
    PIPER_CHECK_OK(save(step));
  }
  Status save(int64_t step) {
    meta.step = step;
    return save_checkpoint(root, meta,
                           {{"layer0.w", {4, 3}, {}, &w1}, {"head.w", {5}, {}, &w2},
                            {"layer0.w.m", {4, 3}, {}, &m1, 0, -1, true}, {"layer0.w.v", {4, 3}, {}, &v1, 0, -1, true}},
                           nullptr, 1.0);
  }
  std::string file() const { return root + "/" + checkpoint_step_name(meta.step) + "/rank-00000.safetensors"; }
};

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
  CheckpointMeta meta{5, {}, {}, 8, "tiny", "ep=2", 2, {}};
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
  CheckpointMeta meta{3, {}, {}, 8, "tiny", "ep=2", 2, {}};
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
  for (const auto& [offset, extent] : std::vector<std::pair<Shape, Shape>>{
           {{0, 0}, {4, 6}}, {{0, 3}, {4, 3}}, {{1, 2}, {2, 3}}, {{3, 0}, {1, 6}}}) {
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
  Status s = save_checkpoint(root, meta, {{"e.w", {4, 6}, {0, 0}, &top}, {"e.w", {4, 6}, {1, 0}, &bottom}}, nullptr,
                             1.0);
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
  CheckpointMeta meta{1, {}, {}, 8, "tiny", "dp=2,zero=1", 2, {}};
  ASSERT_TRUE(save_checkpoint(root, meta,
                              {{"w.m", {4, 6}, {}, &lo, 0, 10, true, {4, 6}},
                               {"w.m", {4, 6}, {}, &hi, 10, 24, true, {4, 6}}},
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
  ASSERT_TRUE(s.save(2).ok());
  EXPECT_FALSE(fs::exists(s.root + "/step-00000002.tmp"));
  ASSERT_TRUE(s.save(3).ok());
  EXPECT_FALSE(fs::exists(s.root + "/step-00000001"));
  EXPECT_TRUE(fs::exists(s.root + "/step-00000002/index.json"));
  EXPECT_EQ(read_all(s.root + "/latest"), "step-00000003\n");
  ASSERT_TRUE(s.save(3).ok());  // the same step again replaces it
  EXPECT_EQ(CheckpointReader::open(s.root).value()->meta().step, 3);
}

TEST(CheckpointTest, CorruptionIsDataLossNamingTheFile) {
  auto restore_all = [](const std::string& root) -> Status {
    PIPER_ASSIGN_OR_RETURN(auto r, CheckpointReader::open(root));
    Tensor w = Tensor::zeros_or_die({4, 3}, MemCategory::kParameters);
    return r->restore("layer0.w", {4, 3}, {}, &w);
  };
  {
    Saved s("flip");  // one flipped bit in the data: caught by the checksum
    std::string bytes = read_all(s.file());
    bytes[bytes.size() - 5] ^= 0x10;
    write_all(s.file(), bytes);
    Status st = restore_all(s.root);
    EXPECT_EQ(st.code(), StatusCode::kDataLoss);
    EXPECT_NE(st.message().find("rank-00000.safetensors"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("checksum"), std::string::npos);
  }
  {
    Saved s("truncate");
    const std::string bytes = read_all(s.file());
    write_all(s.file(), bytes.substr(0, bytes.size() - 8));
    Status st = restore_all(s.root);
    EXPECT_EQ(st.code(), StatusCode::kDataLoss);
    EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
  }
  {
    Saved s("index");
    const std::string index = s.root + "/step-00000042/index.json";
    write_all(index, read_all(index).substr(0, 40));
    Status st = restore_all(s.root);
    EXPECT_EQ(st.code(), StatusCode::kDataLoss);
    EXPECT_NE(st.message().find("index.json"), std::string::npos);
  }
  {
    Saved s("missing");
    fs::remove(s.file());
    EXPECT_EQ(restore_all(s.root).code(), StatusCode::kDataLoss);
  }
  {
    Saved s("pointer");
    write_all(s.root + "/latest", "step-00000007\n");
    Status st = restore_all(s.root);
    EXPECT_EQ(st.code(), StatusCode::kDataLoss);
    EXPECT_NE(st.message().find("latest"), std::string::npos) << st.message();
  }
  Status st = restore_all(temp_dir("nothing"));
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("nothing"), std::string::npos);
}

// Index fields of the wrong type or with sizes that overflow are corrupt-index errors, not an uncaught exception
// or signed overflow (found by fuzz/checkpoint_index_fuzz; regressions in fuzz/corpus/checkpoint_index/).
TEST(CheckpointTest, MistypedOrOverflowingIndexIsDataLoss) {
  const std::string meta = R"("version": 2, "step": 1, "data_position": {"epoch": 0, "index": 0},
      "rng": {"seed": 1, "stream": 0, "counter": 0}, "seq_len": 8, "world_size": 1)";
  auto open_index = [&](const std::string& rest) -> Status {
    auto r = CheckpointReader::from_index_text("{" + meta + ", " + rest + "}", "/nonexistent", "x/index.json");
    return r.ok() ? ok_status() : r.status();
  };
  EXPECT_TRUE(open_index(R"("format": "piper-checkpoint", "files": {}, "tensors": {})").ok());
  const std::string files = R"("files": {"f": {"bytes": 8, "fnv1a64": "0"}})";
  const struct {
    std::string rest;
    const char* needle;
    StatusCode code = StatusCode::kDataLoss;
  } rows[] = {
      {R"("format": {"seed": 1}, "files": {}, "tensors": {})", "format is not 'piper-checkpoint'"},
      {R"("format": "piper-checkpoint", "model": 7, "files": {}, "tensors": {})", "field 'model' is not a string"},
      {R"("format": "piper-checkpoint", "strategy": [], "files": {}, "tensors": {})", "'strategy' is not a string"},
      {R"("format": "piper-checkpoint", "expert_placement": {"0": [4294967296]}, "files": {}, "tensors": {})",
       "expert_placement.0 holds a non-expert"},
      {R"("format": "piper-checkpoint", "files": {}, "tensors": {"w": {"shape": [2], "optimizer": 1, "pieces": []}})",
       "w.optimizer is not true or false"},
      // offset + extent and the product of the extents would overflow int64.
      {R"("format": "piper-checkpoint", )" + std::string(files) + R"(, "tensors": {"w": {"shape": [9223372036854775807],
       "pieces": [{"file": "f", "key": "w", "offset": [9223372036854775807], "extent": [9223372036854775807],
       "range": [0, 1]}]}})",
       "lies outside the tensor's shape", StatusCode::kInvalidArgument},
      {R"("format": "piper-checkpoint", )" + std::string(files) + R"(, "tensors": {"w": {"shape": [4294967296,
       4294967296], "pieces": [{"file": "f", "key": "w", "offset": [0, 0], "extent": [4294967296, 4294967296],
       "range": [0, 1]}]}})",
       "more than 2^63 elements", StatusCode::kInvalidArgument},
  };
  for (const auto& row : rows) {
    Status st = open_index(row.rest);
    EXPECT_EQ(st.code(), row.code) << row.rest << ": " << st.message();
    EXPECT_NE(st.message().find(row.needle), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace piper
