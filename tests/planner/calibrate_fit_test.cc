// `piper calibrate`'s GEMM curve fit (src/cli/calibrate_fit.h), and the command end to end.
#include "piper/cli/calibrate_fit.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "piper/cost/device_model.h"

namespace piper::cli {
namespace {

TEST(CalibrateFitTest, RecoversTheCurveFromExactPoints) {
  std::vector<GemmPoint> points;
  for (double d : {8.0, 16.0, 64.0, 256.0, 1024.0}) points.push_back({d, 0.7 * d / (d + 48.0)});
  auto c = fit_gemm_curve(points);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_NEAR(c->gemm_efficiency, 0.7, 1e-12);
  EXPECT_NEAR(c->gemm_half_dim, 48.0, 1e-9);
}

TEST(CalibrateFitTest, RefusesPointsThatCannotBeFitted) {
  EXPECT_FALSE(fit_gemm_curve({{64, 0.5}}).ok());             // one size
  EXPECT_FALSE(fit_gemm_curve({{64, 0.5}, {64, 0.6}}).ok());  // one distinct size
  EXPECT_FALSE(fit_gemm_curve({{64, 0.0}, {128, 0.6}}).ok());
  // Efficiency falling with size: no curve of this form; the message says to rerun on an idle machine.
  auto falling = fit_gemm_curve({{16, 0.9}, {256, 0.3}});
  ASSERT_FALSE(falling.ok());
  EXPECT_NE(falling.status().message().find("too noisy"), std::string::npos) << falling.status().message();
}

TEST(CalibrateCliTest, WritesACalibrationThatTheModelLoads) {
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("piper_calibrate_" + std::to_string(::getpid()) + ".json")).string();
  const std::string cmd = std::string(PIPER_BIN_PATH) + " calibrate --rounds 1 --out " + out + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  std::string text;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), f)) text.append(buf.data(), n);
  ASSERT_EQ(pclose(f), 0) << text;
  EXPECT_NE(text.find("calibrate: GEMM 8 x 512 x 512"), std::string::npos) << text;  // progress lines
  auto c = cost::Calibration::load(out);
  ASSERT_TRUE(c.ok()) << c.status().to_string() << "\n" << text;
  EXPECT_GT(c->gemm_efficiency, 0);
  EXPECT_LE(c->gemm_efficiency, 1);
  EXPECT_FALSE(c->gemm_table);
  std::filesystem::remove(out);
}

}  // namespace
}  // namespace piper::cli
