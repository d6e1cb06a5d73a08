// read_regular_file refuses what would block or mislead; write_file_atomic leaves no partial file; elide.
#include "piper/base/files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace piper {
namespace {
namespace fs = std::filesystem;

fs::path temp_dir() {
  const fs::path dir = fs::temp_directory_path() / ("piper_files_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

TEST(FilesTest, ReadsARegularFile) {
  const std::string path = (temp_dir() / "a.txt").string();
  std::ofstream(path) << "hello";
  auto text = read_regular_file(path);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(*text, "hello");
}

TEST(FilesTest, MissingFileIsNotFound) {
  auto text = read_regular_file("/nonexistent/piper/x.json", "--model");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(text.status().message(), "--model '/nonexistent/piper/x.json' does not exist; check the path");
}

TEST(FilesTest, DirectoryIsRefusedAsADirectory) {
  auto text = read_regular_file(temp_dir().string());
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(text.status().message().find("is a directory; give a file"), std::string::npos);
}

TEST(FilesTest, FifoIsRefusedWithoutBlocking) {
  const std::string path = (temp_dir() / "fifo").string();
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto text = read_regular_file(path);  // a FIFO with no writer: an open() would block forever
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(text.status().message().find("is not a regular file (a FIFO)"), std::string::npos)
      << text.status().message();
}

TEST(FilesTest, CharacterDeviceIsRefused) {
  auto text = read_regular_file("/dev/zero");  // would be read forever
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("a character device"), std::string::npos) << text.status().message();
}

TEST(FilesTest, AtomicWriteReplacesWholeAndLeavesNoTemporary) {
  const fs::path dir = temp_dir() / "atomic";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "out.json").string();
  ASSERT_TRUE(write_file_atomic(path, "old").ok());
  ASSERT_TRUE(write_file_atomic(path, "new contents").ok());
  EXPECT_EQ(*read_regular_file(path), "new contents");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) entries += e.path().filename() == "out.json" ? 1 : 100;
  EXPECT_EQ(entries, 1);  // no out.json.tmp.<pid> left behind
}

TEST(FilesTest, FailedAtomicWriteLeavesNothing) {
  const std::string path = (temp_dir() / "no-such-dir" / "out.json").string();
  Status st = write_file_atomic(path, "x");
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(fs::exists(path));
  st = write_file_atomic(temp_dir().string(), "x");  // a directory as the target
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("is a directory"), std::string::npos) << st.message();
}

TEST(FilesTest, ElideKeepsShortValuesAndCutsLongOnes) {
  EXPECT_EQ(elide("dp=8,pp=4"), "dp=8,pp=4");
  const std::string long_value(100000, 'x');
  const std::string e = elide(long_value);
  EXPECT_EQ(e, std::string(80, 'x') + "... (100000 bytes)");
  const std::string msg = elide_long_words("strategy: unknown key '" + long_value + "'; keys are dp, pp");
  EXPECT_LT(msg.size(), 200u);
  EXPECT_NE(msg.find("(100003 bytes) keys are dp, pp"), std::string::npos) << msg;
}

}  // namespace
}  // namespace piper
