#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "piper/base/json.h"
#include "piper/runtime/data/data_loader.h"
#include "piper/runtime/data/data_source.h"
#include "piper/runtime/data/tokenizer.h"

namespace piper {
namespace {
namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("piper_data_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

TEST(TokenizerTest, RoundTripsAnyBytes) {
  std::string text = "Hello, world! \xc3\xa9";
  text.push_back('\0');
  text.push_back('\xff');
  const auto ids = ByteTokenizer::encode(text);
  EXPECT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids.back(), 255);
  EXPECT_EQ(*ByteTokenizer::decode(ids), text);
  Result<std::string> bad = ByteTokenizer::decode({65, 256});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(bad.status().message().find("position 1"), std::string::npos);
}

TEST(DataSourceTest, TextAndTokenFiles) {
  const std::string text_path = temp_path("a.txt"), tok_path = temp_path("b.u16");
  ASSERT_TRUE(write_text_file(text_path, "abc").ok());
  ASSERT_TRUE(write_token_file(tok_path, {1, 300, 2}).ok());
  Result<Corpus> text = load_corpus(text_path, 256);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(text->tokens, (std::vector<uint16_t>{'a', 'b', 'c'}));
  Result<Corpus> toks = load_corpus(tok_path, 512);
  ASSERT_TRUE(toks.ok());
  EXPECT_EQ(toks->tokens, (std::vector<uint16_t>{1, 300, 2}));
  // Token id out of range for the vocabulary.
  Result<Corpus> small = load_corpus(tok_path, 256);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(small.status().message().find("token 300 at index 1"), std::string::npos);
  EXPECT_NE(small.status().message().find(tok_path), std::string::npos);
  // Truncated token file.
  ASSERT_TRUE(write_text_file(temp_path("c.tokens"), "abc").ok());
  EXPECT_EQ(load_corpus(temp_path("c.tokens"), 256).status().code(), StatusCode::kDataLoss);
}

TEST(DataSourceTest, MissingFileIsNotFound) {
  Result<Corpus> c = load_corpus("/nonexistent/corpus.txt", 256);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("/nonexistent/corpus.txt"), std::string::npos);
}

TEST(DataSourceTest, DefaultCorpusIsTheFortunesText) {
  // scripts/setup.sh installs the fortunes package.
  Result<Corpus> c = load_corpus("", 256);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_GT(c->tokens.size(), 500000u);
  for (const std::string& f : c->files) {
    EXPECT_NE(fs::path(f).extension(), ".dat");
    EXPECT_FALSE(fs::is_symlink(f));
  }
  EXPECT_TRUE(std::is_sorted(c->files.begin(), c->files.end()));
}

std::vector<uint16_t> ramp(int n) {
  std::vector<uint16_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(i);
  return t;
}

TEST(DataLoaderTest, BatchesAreShiftedWindowsInASeededPermutation) {
  Result<DataLoader> loader = DataLoader::create(ramp(101), 10, 3, 7);
  ASSERT_TRUE(loader.ok());
  EXPECT_EQ(loader->num_windows(), 10);
  std::multiset<int> starts;
  Batch b;
  for (int i = 0; i < 3; ++i) {
    loader->next_batch(&b);
    for (int s = 0; s < 3; ++s) {
      for (int t = 0; t < 10; ++t) EXPECT_EQ(b.targets[s * 10 + t], b.inputs[s * 10 + t] + 1);
      EXPECT_EQ(b.inputs[s * 10] % 10, 0);
      starts.insert(b.inputs[s * 10]);
    }
  }
  EXPECT_EQ(starts.size(), 9u);
  EXPECT_EQ(std::set<int>(starts.begin(), starts.end()).size(), 9u);  // no window twice within an epoch
  loader->next_batch(&b);                                             // crosses into epoch 1
  EXPECT_EQ(loader->position().epoch, 1);
  EXPECT_EQ(loader->position().index, 2);
  // A different seed gives a different order; the same seed the same.
  Batch b7, b8, b7again;
  DataLoader::create(ramp(101), 10, 5, 7)->next_batch(&b7);
  DataLoader::create(ramp(101), 10, 5, 8)->next_batch(&b8);
  DataLoader::create(ramp(101), 10, 5, 7)->next_batch(&b7again);
  EXPECT_EQ(b7.inputs, b7again.inputs);
  EXPECT_NE(b7.inputs, b8.inputs);
}

TEST(DataLoaderTest, SeekResumesTheSameBatches) {
  DataLoader a = std::move(DataLoader::create(ramp(1001), 16, 4, 3)).value();
  Batch b;
  for (int i = 0; i < 20; ++i) a.next_batch(&b);  // several epochs
  const DataPosition pos = a.position();
  Batch expected;
  a.next_batch(&expected);
  DataLoader c = std::move(DataLoader::create(ramp(1001), 16, 4, 3)).value();
  ASSERT_TRUE(c.seek(pos).ok());
  Batch got;
  c.next_batch(&got);
  EXPECT_EQ(got.inputs, expected.inputs);
  EXPECT_EQ(c.seek({0, 1000}).code(), StatusCode::kInvalidArgument);
}

TEST(DataLoaderTest, TooShortCorpusIsAnError) {
  Result<DataLoader> l = DataLoader::create(ramp(10), 10, 1, 0);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("10 tokens"), std::string::npos);
  EXPECT_FALSE(DataLoader::create(ramp(100), 0, 1, 0).ok());
}

}  // namespace
}  // namespace piper
