// The dependency table of docs/ARCHITECTURE.md is the rule for every `#include "piper/<module>/..."` under src/.
#include "layering.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace piper::layering {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

ModuleTable architecture_table() {
  auto table = parse_module_table(read_text(fs::path(PIPER_SOURCE_DIR) / "docs" / "ARCHITECTURE.md"));
  EXPECT_TRUE(table.ok()) << table.status().message();
  return table.ok() ? *table : ModuleTable{};
}

std::vector<SourceFile> source_files() {
  const fs::path src = fs::path(PIPER_SOURCE_DIR) / "src";
  std::vector<SourceFile> files;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh")) continue;
    files.push_back({fs::relative(entry.path(), src).generic_string(), read_text(entry.path())});
  }
  return files;
}

std::string lines(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += s + "\n";
  return out;
}

TEST(Layering, TheSourcesKeepToTheArchitectureTable) {
  ModuleTable table = architecture_table();
  std::vector<SourceFile> files = source_files();
  ASSERT_GT(files.size(), 100u) << "src/ not found under " << PIPER_SOURCE_DIR;
  std::vector<std::string> bad = find_violations(table, files);
  EXPECT_TRUE(bad.empty()) << "includes that docs/ARCHITECTURE.md's module table does not allow (change the code, "
                              "or add the edge to the table with its reason):\n"
                           << lines(bad);
}

TEST(Layering, AForbiddenIncludeAddedToTheTreeIsReported) {
  ModuleTable table = architecture_table();
  std::vector<SourceFile> files = source_files();
  size_t before = find_violations(table, files).size();
  for (SourceFile& f : files) {
    if (f.path == "comm/communicator.cc") f.text += "\n#include \"piper/strategy/strategy.h\"\n";
    if (f.path == "sim/simulate.cc") f.text += "\n#include \"piper/runtime/trainer.h\"\n";
    if (f.path == "runtime/model/model.cc") f.text += "\n#include \"piper/runtime/exec/executor.h\"\n";
  }
  std::vector<std::string> after = find_violations(table, files);
  ASSERT_EQ(after.size(), before + 3) << lines(after);
  EXPECT_NE(lines(after).find("comm/communicator.cc:"), std::string::npos);
  EXPECT_NE(lines(after).find("comm -> strategy"), std::string::npos);
  EXPECT_NE(lines(after).find("sim -> runtime"), std::string::npos);
  EXPECT_NE(lines(after).find("runtime/model -> runtime/exec"), std::string::npos);
}

// The runtime's folders (docs/ARCHITECTURE.md, "The runtime's folders"): rows of their own inside one library.
TEST(Layering, TheRuntimesFoldersIncludeOnlyWhatTheirRowsList) {
  ModuleTable table = architecture_table();
  auto check = [&](const std::string& path, const std::string& header) {
    return find_violations(table, {{path, "#include \"piper/" + header + "\"\n"}});
  };
  EXPECT_EQ(module_of(table, "runtime/model/chunks/attn.cc"), "runtime/model");
  EXPECT_EQ(module_of(table, "runtime/gpu/gpu_trainer.cc"), "runtime");
  EXPECT_TRUE(check("runtime/model/chunks/x.cc", "runtime/model/model.h").empty());  // its own folder
  EXPECT_TRUE(check("runtime/exec/x.cc", "runtime/model/optimizer.h").empty());
  EXPECT_TRUE(check("runtime/exec/x.cc", "runtime/data/data_loader.h").empty());
  EXPECT_TRUE(check("runtime/exec/x.cc", "compile/plan.h").empty());
  EXPECT_TRUE(check("runtime/checkpoint/x.cc", "runtime/data/data_loader.h").empty());
  EXPECT_TRUE(check("runtime/trainer.cc", "runtime/exec/executor.h").empty());      // the top reaches every folder
  EXPECT_TRUE(check("runtime/trainer.cc", "runtime/model/chunks/tp_slice.h").empty());
  EXPECT_TRUE(check("runtime/gpu/x.cc", "runtime/exec/memory_pool.h").empty());
  EXPECT_EQ(check("runtime/model/x.cc", "runtime/exec/executor.h").size(), 1u);     // the model knows no executor
  EXPECT_EQ(check("runtime/model/x.cc", "runtime/checkpoint/safetensors.h").size(), 1u);
  EXPECT_EQ(check("runtime/data/x.cc", "runtime/model/model.h").size(), 1u);
  EXPECT_EQ(check("runtime/exec/x.cc", "runtime/checkpoint/checkpoint.h").size(), 1u);
  EXPECT_EQ(check("runtime/exec/x.cc", "runtime/trainer.h").size(), 1u);            // no folder includes the top
  EXPECT_EQ(check("runtime/checkpoint/x.cc", "runtime/exec/executor.h").size(), 1u);
  EXPECT_EQ(check("runtime/exec/x.cc", "ir/graph.h").size(), 1u);                   // its own "(not ir: ...)"
  EXPECT_EQ(check("runtime/model/x.cc", "compile/plan.h").size(), 1u);
}

TEST(Layering, EdgesFollowTheTableTransitivelyAndSubfoldersAreModulesOfTheirOwn) {
  ModuleTable table = architecture_table();
  auto check = [&](const std::string& path, const std::string& header) {
    return find_violations(table, {{path, "#include \"piper/" + header + "\"\n"}});
  };
  EXPECT_TRUE(check("compile/lower.cc", "spec/model_spec.h").empty());  // compile -> ir -> spec
  EXPECT_TRUE(check("strategy/schedules/x.cc", "ir/graph.h").empty());
  EXPECT_TRUE(check("kernels/cpu/x.cc", "kernels/x.h").empty());       // its own module
  EXPECT_EQ(check("strategy/strategy.cc", "strategy/schedules/schedule.h").size(), 1u);
  EXPECT_EQ(check("cost/x.cc", "ir/graph.h").size(), 1u);
  EXPECT_EQ(check("base/x.cc", "spec/model_spec.h").size(), 1u);
  EXPECT_TRUE(check("cli/x.cc", "runtime/trainer.h").empty());  // cli: everything
  EXPECT_EQ(check("newmodule/x.cc", "base/status.h").size(), 1u);  // a folder without a row
  // The executors read only the Plan: compile reaches ir, but neither sim nor runtime may include it itself.
  EXPECT_TRUE(check("runtime/x.cc", "compile/plan.h").empty());
  EXPECT_TRUE(check("runtime/x.cc", "spec/model_spec.h").empty());  // runtime -> compile -> ir -> spec
  EXPECT_EQ(check("runtime/x.cc", "ir/graph.h").size(), 1u);
  EXPECT_EQ(check("sim/x.cc", "ir/types.h").size(), 1u);
}

TEST(Layering, ABrokenTableIsRefusedWithTheRow) {
  auto unknown = parse_module_table("| `base/` | x | — |\n| `spec/` | x | base, nope |\n");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("'nope'"), std::string::npos);
  auto cycle = parse_module_table("| `a/` | x | b |\n| `b/` | x | a |\n");
  ASSERT_FALSE(cycle.ok());
  EXPECT_NE(cycle.status().message().find("one way"), std::string::npos);
  EXPECT_FALSE(parse_module_table("no table here\n").ok());
  auto ok = parse_module_table("| `a/` | x | — |\n| `b/` | x | a (why) |\n| `c/` | x | everything |\n");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(allowed_includes(*ok, "b"), (std::set<std::string>{"a"}));
  EXPECT_EQ(allowed_includes(*ok, "c"), (std::set<std::string>{"a", "b", "c"}));
  auto no = parse_module_table("| `a/` | x | — |\n| `b/` | x | a |\n| `c/` | x | b (not a: why) |\n");
  ASSERT_TRUE(no.ok()) << no.status().message();
  EXPECT_EQ(allowed_includes(*no, "c"), (std::set<std::string>{"b"}));
  auto typo = parse_module_table("| `a/` | x | — |\n| `b/` | x | a (not z: why) |\n");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("'not z'"), std::string::npos);
}

}  // namespace
}  // namespace piper::layering
