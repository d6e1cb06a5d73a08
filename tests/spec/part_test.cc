// The one Part enum: chunk names round-trip, unknown names are refused with the names there are.
#include "piper/spec/part.h"

#include <gtest/gtest.h>

namespace piper {
namespace {

TEST(Part, EveryChunkNameReadsBackToItsPart) {
  for (Part p : kChunkParts) {
    ASSERT_TRUE(is_chunk(p)) << to_string(p);
    EXPECT_EQ(chunk_part(chunk_name(p)), p) << chunk_name(p);
    auto parsed = parse_chunk_part(chunk_name(p), "x");
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_EQ(chunk_part("attn"), Part::kAttention);
  EXPECT_EQ(chunk_part("shared"), Part::kSharedExperts);
  EXPECT_EQ(chunk_part("mlp"), Part::kDenseMlp);
  EXPECT_EQ(std::string(to_string(Part::kSharedExperts)), "shared_experts");  // the resource model's name
}

TEST(Part, PricedPiecesAndCommunicationTagsAreNoChunks) {
  EXPECT_FALSE(is_chunk(Part::kNorms));
  EXPECT_FALSE(is_chunk(Part::kAttentionCore));
  EXPECT_EQ(std::string(chunk_name(Part::kNorms)), "");
  for (const char* tag : {"dispatch", "combine", "m2n", "attn.tp_ag", "", "attention", "Attn"}) {
    EXPECT_FALSE(chunk_part(tag).has_value()) << tag;
  }
  auto bad = parse_chunk_part("atn", "plan.json.programs[0]...part");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "plan.json.programs[0]...part: part 'atn' is not a chunk part; use one of embed, attn, router, experts, "
            "shared, mlp, head");
}

}  // namespace
}  // namespace piper
