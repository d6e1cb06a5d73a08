#include "piper/tensor/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace piper {
namespace {

// Known-answer vectors of Philox4x32-10 (Random123's kat_vectors); our (seed, stream, counter) map to
// key = (seed lo, seed hi), counter words = (counter lo, counter hi, stream lo, stream hi).
TEST(RngTest, PhiloxKnownAnswers) {
  EXPECT_EQ(philox4x32(0, 0, 0), (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32(~0ull, ~0ull, ~0ull),
            (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull),
            (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(RngTest, FillIsIndependentOfSplitting) {
  Rng rng(42, 3);
  std::vector<float> whole(1000), parts(1000);
  fill_normal(whole.data(), 1000, rng, 17, 0.0f, 1.0f);
  // As if two threads filled halves.
  fill_normal(parts.data(), 400, rng, 17, 0.0f, 1.0f);
  fill_normal(parts.data() + 400, 600, rng, 17 + 400, 0.0f, 1.0f);
  EXPECT_EQ(whole, parts);
}

TEST(RngTest, MomentsAndStreamsDiffer) {
  Rng rng(7);
  double sum = 0, sum2 = 0, usum = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double x = rng.normal_at(i);
    sum += x;
    sum2 += x * x;
    const float u = rng.uniform_at(i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    usum += u;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.03);
  EXPECT_NEAR(sum2 / n, 1.0, 0.05);
  EXPECT_NEAR(usum / n, 0.5, 0.01);
  EXPECT_NE(Rng(7, 0).bits_at(0), Rng(7, 1).bits_at(0));
  EXPECT_NE(Rng(7, 0).bits_at(0), Rng(8, 0).bits_at(0));
}

TEST(RngTest, StateRoundTripContinuesTheSequence) {
  Rng a(5);
  for (int i = 0; i < 10; ++i) a.next_uniform();
  Rng b(a.state());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_bits(), b.next_bits());
  EXPECT_EQ(a.reserve(100), 20u);
  EXPECT_EQ(a.state().counter, 120u);
  for (int i = 0; i < 100; ++i) EXPECT_LT(a.next_below(7), 7u);
}

}  // namespace
}  // namespace piper
