// The worked p=4, m=8 orders of reference/schedules.md 3 (1F1B, interleaved v=2, ZB-H1, DualPipeV) and the
// unit-time makespans of 3.9, reproduced from the directives the generators emit.
//
// Notation differs: the reference writes a full backward "B" and an input-grad backward "I"; Piper writes a
// fused backward "BW" and "B" for the input gradient. to_piper() converts a reference row.
#include <gtest/gtest.h>

#include <sstream>

#include "schedule_test_util.h"

namespace piper::compile {
namespace {

using testing::run_schedule;

// Converts one reference action ("0F3", "7B2", "3I1", "(0F7;7B3)") to Piper's text.
std::string convert(const std::string& a) {
  size_t i = 0;
  while (i < a.size() && isdigit(static_cast<unsigned char>(a[i]))) ++i;
  std::string stage = a.substr(0, i), mb = a.substr(i + 1);
  char k = a[i];
  if (k == 'I') return stage + "B" + mb;
  if (k == 'B') return stage + "BW" + mb;
  return a;
}

std::string to_piper(const std::string& row, bool with_stage) {
  std::istringstream in(row);
  std::string tok, out;
  while (in >> tok) {
    std::string conv;
    bool group = tok.front() == '(';
    std::string body = group ? tok.substr(1, tok.size() - 2) : tok;
    std::istringstream parts(body);
    std::string part;
    int n = 0;
    while (std::getline(parts, part, ';')) {
      std::string c = convert(part);
      if (!with_stage) c = c.substr(c.find_first_not_of("0123456789"));
      conv += (n++ ? ";" : "") + c;
    }
    if (group) conv = "(" + conv + ")";
    out += (out.empty() ? "" : " ") + conv;
  }
  return out;
}

std::vector<std::string> rows(const PipelineSchedule& s) {
  std::vector<std::string> out;
  std::istringstream in(format_action_lists(s));
  std::string line;
  while (std::getline(in, line)) out.push_back(line.substr(line.find(": ") + 2));
  return out;
}

void expect_rows(const std::string& name, int v, const std::vector<std::string>& reference, bool with_stage) {
  auto r = run_schedule(name, 4, 8, v);
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto got = rows(r->schedule);
  ASSERT_EQ(got.size(), reference.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(got[k], to_piper(reference[k], with_stage)) << name << " rank " << k;
  }
}

TEST(ScheduleGoldenTest, OneFOneB) {
  expect_rows("1f1b", 1,
              {"0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7",
               "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7",
               "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7",
               "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7"},
              false);
}

TEST(ScheduleGoldenTest, Interleaved) {
  expect_rows("interleaved", 2,
              {"0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 0F4 0F5 0F6 4B0 0F7 4B1 4F4 4B2 4F5 4B3 4F6 0B0 4F7 0B1 0B2 0B3 4B4 "
               "4B5 4B6 4B7 0B4 0B5 0B6 0B7",
               "1F0 1F1 1F2 1F3 5F0 5F1 5F2 5F3 1F4 5B0 1F5 5B1 1F6 5B2 1F7 5B3 5F4 1B0 5F5 1B1 5F6 1B2 5F7 1B3 5B4 "
               "5B5 5B6 5B7 1B4 1B5 1B6 1B7",
               "2F0 2F1 2F2 2F3 6F0 6F1 6F2 6B0 6F3 6B1 2F4 6B2 2F5 6B3 2F6 2B0 2F7 2B1 6F4 2B2 6F5 2B3 6F6 6B4 6F7 "
               "6B5 6B6 6B7 2B4 2B5 2B6 2B7",
               "3F0 3F1 3F2 3F3 7F0 7B0 7F1 7B1 7F2 7B2 7F3 7B3 3F4 3B0 3F5 3B1 3F6 3B2 3F7 3B3 7F4 7B4 7F5 7B5 7F6 "
               "7B6 7F7 7B7 3B4 3B5 3B6 3B7"},
              true);
}

TEST(ScheduleGoldenTest, ZbH1) {
  expect_rows("zb-h1", 1,
              {"0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0F6 0I3 0W3 0F7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7",
               "1F0 1F1 1F2 1I0 1F3 1I1 1W0 1F4 1I2 1W1 1F5 1I3 1W2 1F6 1I4 1W3 1F7 1I5 1W4 1I6 1W5 1I7 1W6 1W7",
               "2F0 2F1 2I0 2F2 2I1 2F3 2I2 2W0 2F4 2I3 2W1 2F5 2I4 2W2 2F6 2I5 2W3 2F7 2I6 2W4 2I7 2W5 2W6 2W7",
               "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3F6 3I6 3W3 3F7 3I7 3W4 3W5 3W6 3W7"},
              false);
}

TEST(ScheduleGoldenTest, DualPipeV) {
  expect_rows("dualpipev", 2,
              {"0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3 (0F7;7B3) (7F4;0B0) 7B4 (7F5;0B1) "
               "7B5 (7F6;0B2) 7B6 (7F7;0B3) 7B7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7",
               "1F0 1F1 1F2 1F3 1F4 6F0 1F5 6F1 6I0 6W0 6F2 6I1 6W1 6F3 (1F6;6B2) (6F4;1B0) (1F7;6B3) (6F5;1B1) 6B4 "
               "(6F6;1B2) 6B5 (6F7;1B3) 6B6 1B4 6I7 1I5 6W7 1I6 1W5 1I7 1W6 1W7",
               "2F0 2F1 2F2 5F0 2F3 5F1 2F4 5F2 5I0 5W0 5F3 (2F5;5B1) (5F4;2B0) (2F6;5B2) (5F5;2B1) (2F7;5B3) (5F6;2B2) "
               "5B4 (5F7;2B3) 5B5 2B4 5B6 2I5 5I7 2I6 2W5 2I7 5W7 2W6 2W7",
               "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 3F4 4B0 (4F4;3B0) (3F5;4B1) (4F5;3B1) (3F6;4B2) (4F6;3B2) (3F7;4B3) "
               "(4F7;3B3) 4B4 3B4 4B5 3B5 4I6 3I6 4I7 3I7 4W6 3W6 4W7 3W7"},
              true);
}

// reference/schedules.md 3.9: T_F = 1, T_I = T_W = 1 per full stage, halved for two-stages-per-rank schedules.
TEST(ScheduleGoldenTest, UnitTimeMakespans) {
  struct Row {
    const char* name;
    int v;
    double cost;
    double makespan;
  };
  for (const Row& row : {Row{"gpipe", 1, 1, 33}, Row{"1f1b", 1, 1, 33}, Row{"zb-h1", 1, 1, 27},
                         Row{"interleaved", 2, 0.5, 28.5}, Row{"dualpipev", 2, 0.5, 27}}) {
    auto r = run_schedule(row.name, 4, 8, row.v, {row.cost, row.cost, row.cost});
    ASSERT_TRUE(r.ok()) << row.name << ": " << r.status().message();
    EXPECT_DOUBLE_EQ(r->timeline.makespan, row.makespan) << row.name;
  }
}

}  // namespace
}  // namespace piper::compile
