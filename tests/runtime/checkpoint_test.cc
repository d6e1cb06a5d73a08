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

struct Saved {
  std::string dir;
  Tensor w1 = ramp({4, 3}, 0.0f), w2 = ramp({5}, 10.0f), m1 = ramp({4, 3}, -1.0f), v1 = ramp({4, 3}, 2.0f);
  CheckpointMeta meta{42, {3, 17}, {0xfeedfacecafebeefull, 1, 99}};
  explicit Saved(const std::string& name) : dir(temp_dir(name)) {
    PIPER_CHECK_OK(
        save_checkpoint(dir, meta, {{"layer0.w", &w1}, {"head.w", &w2}}, {{"layer0.w.m", &m1}, {"layer0.w.v", &v1}}));
  }
};

TEST(CheckpointTest, RoundTrip) {
  Saved s("roundtrip");
  Result<Checkpoint> c = load_checkpoint(s.dir);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->meta.step, 42);
  EXPECT_EQ(c->meta.data.epoch, 3);
  EXPECT_EQ(c->meta.data.index, 17);
  EXPECT_EQ(c->meta.rng.seed, 0xfeedfacecafebeefull);
  EXPECT_EQ(c->meta.rng.counter, 99u);
  ASSERT_EQ(c->model.size(), 2u);
  ASSERT_EQ(c->optimizer.size(), 2u);
  Tensor w1 = Tensor::zeros_or_die({4, 3}, MemCategory::kParameters);
  ASSERT_TRUE(restore_tensor(c->model, "layer0.w", &w1).ok());
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(w1[i], s.w1[i]);
  EXPECT_EQ(c->optimizer.at("layer0.w.v")[11], s.v1[11]);
  Tensor wrong = Tensor::zeros_or_die({3, 4}, MemCategory::kParameters);
  EXPECT_EQ(restore_tensor(c->model, "layer0.w", &wrong).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(restore_tensor(c->model, "nope", &wrong).code(), StatusCode::kInvalidArgument);
}

TEST(CheckpointTest, CorruptionIsDataLossNamingTheFile) {
  {
    Saved s("flip");  // one flipped bit in the data: caught by the checksum
    std::string bytes = read_all(s.dir + "/model.safetensors");
    bytes[bytes.size() - 5] ^= 0x10;
    write_all(s.dir + "/model.safetensors", bytes);
    Result<Checkpoint> c = load_checkpoint(s.dir);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(c.status().message().find("model.safetensors"), std::string::npos);
    EXPECT_NE(c.status().message().find("checksum"), std::string::npos);
  }
  {
    Saved s("truncate");
    const std::string bytes = read_all(s.dir + "/optimizer.safetensors");
    write_all(s.dir + "/optimizer.safetensors", bytes.substr(0, bytes.size() - 8));
    Result<Checkpoint> c = load_checkpoint(s.dir);
    EXPECT_EQ(c.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(c.status().message().find("optimizer.safetensors"), std::string::npos);
  }
  {
    Saved s("index");
    write_all(s.dir + "/index.json", read_all(s.dir + "/index.json").substr(0, 40));
    Result<Checkpoint> c = load_checkpoint(s.dir);
    EXPECT_EQ(c.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(c.status().message().find("index.json"), std::string::npos);
  }
  {
    Saved s("missing");
    fs::remove(s.dir + "/model.safetensors");
    EXPECT_EQ(load_checkpoint(s.dir).status().code(), StatusCode::kDataLoss);
  }
  EXPECT_EQ(load_checkpoint(temp_dir("nothing")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace piper
