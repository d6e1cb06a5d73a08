#include "reference_step.h"

#include <gtest/gtest.h>

#include "piper/base/check.h"
#include "piper/runtime/data/data_source.h"
#include "piper/tensor/rng.h"

namespace piper::runtime::testing {

std::string write_pattern_token_file(const std::string& path) {
  std::vector<uint16_t> tokens;
  Rng rng(5);
  for (int i = 0; i < 4000; ++i) {
    const uint16_t a = static_cast<uint16_t>(rng.next_below(8));
    tokens.push_back(a);
    tokens.push_back(static_cast<uint16_t>(8 + 2 * a));
    tokens.push_back(static_cast<uint16_t>(9 + 2 * a) % 32);
  }
  EXPECT_TRUE(write_token_file(path, tokens).ok()) << path;
  return path;
}

ModelSpec small_moe_spec(bool shared_expert) {
  ModelSpec m;
  m.name = "small-moe-test";
  m.num_layers = 3;
  m.hidden_size = 16;
  m.num_heads = 2;
  m.num_kv_heads = 1;
  m.head_dim = 8;
  m.mlp = MlpType::kSwiGLU;
  m.intermediate_size = 24;
  m.moe.num_experts = 4;
  m.moe.top_k = 2;
  m.moe.expert_intermediate_size = 12;
  m.moe.num_shared_experts = shared_expert ? 1 : 0;
  m.moe.shared_expert_intermediate_size = shared_expert ? 8 : 0;
  m.moe.first_k_dense_layers = 1;
  m.moe.layer_freq = 1;
  m.vocab_size = 32;
  m.max_seq_len = 64;
  m.rope_theta = 10000;
  return m;
}

Batch random_batch(int64_t batch_size, int64_t seq, int64_t vocab, uint64_t seed) {
  Rng rng(seed, 7);
  Batch b;
  b.batch_size = batch_size;
  b.seq_len = seq;
  for (int64_t i = 0; i < batch_size * seq; ++i) {
    b.inputs.push_back(static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(vocab))));
    b.targets.push_back(static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(vocab))));
  }
  return b;
}

namespace {

struct Node {
  Chunk* chunk = nullptr;
  std::vector<int> inputs;  // indices of producer nodes, in graph edge order
  std::unique_ptr<Stash> stash;
  Activation out;
  Gradient dx;
  std::vector<int> consumers;
};

}  // namespace

ReferenceResult reference_step(Model& model, const Batch& batch, int num_microbatches, Allocator* allocator,
                               bool backward) {
  model.zero_grads();
  StepContext ctx{num_microbatches, allocator};
  const int64_t mbs = batch.batch_size / num_microbatches;
  ReferenceResult r;
  for (int mb = 0; mb < num_microbatches; ++mb) {
    // Wire the chunks: embed, per layer attn -> (router -> experts, attn -> shared) | mlp, then head.
    std::vector<Node> nodes;
    std::vector<int> prev;
    for (const auto& c : model.chunks()) {
      Node n;
      n.chunk = c.get();
      const Part part = c->part();
      if (part == Part::kEmbedding) {
        prev = {};
      } else if (part == Part::kAttention) {
        n.inputs = prev;
      } else if (part == Part::kRouter || part == Part::kDenseMlp || part == Part::kSharedExperts) {
        // The layer's attn is the latest attn node.
        int attn = -1;
        for (int i = static_cast<int>(nodes.size()) - 1; i >= 0; --i) {
          if (nodes[static_cast<size_t>(i)].chunk->part() == Part::kAttention) {
            attn = i;
            break;
          }
        }
        n.inputs = {attn};
      } else if (part == Part::kExperts) {
        n.inputs = {static_cast<int>(nodes.size()) - 1};  // its router
      } else if (part == Part::kHead) {
        n.inputs = prev;
      }
      const int id = static_cast<int>(nodes.size());
      if (part == Part::kEmbedding || part == Part::kDenseMlp) prev = {id};
      if (part == Part::kExperts) prev = {id};
      if (part == Part::kSharedExperts) prev.push_back(id);
      nodes.push_back(std::move(n));
    }
    for (size_t i = 0; i < nodes.size(); ++i) {
      for (int p : nodes[i].inputs) nodes[static_cast<size_t>(p)].consumers.push_back(static_cast<int>(i));
    }
    const int64_t offset = mb * mbs * batch.seq_len;
    Microbatch m{batch.inputs.data() + offset, batch.targets.data() + offset, mbs, batch.seq_len};
    for (Node& n : nodes) {
      std::vector<const Activation*> in;
      for (int p : n.inputs) in.push_back(&nodes[static_cast<size_t>(p)].out);
      auto st = n.chunk->forward(ctx, m, in, &n.out);
      PIPER_CHECK_OK(st.status());
      n.stash = std::move(st).value();
      r.loss += n.stash->loss;
      r.aux_loss += n.stash->aux_loss;
    }
    if (!backward) continue;
    for (size_t k = nodes.size(); k-- > 0;) {
      Node& n = nodes[k];
      // Gradients arrive in the order of the consumer's edges into this chunk's backward: router before shared.
      std::vector<const Gradient*> grads;
      for (int c : n.consumers) grads.push_back(&nodes[static_cast<size_t>(c)].dx);
      PIPER_CHECK_OK(n.chunk->backward_input(ctx, grads, *n.stash, &n.dx));
      n.chunk->backward_weight(ctx, *n.stash);
    }
  }
  r.loss /= num_microbatches;
  return r;
}

}  // namespace piper::runtime::testing
