// Upper bounds on model, cluster, training and strategy sizes, checked where the values enter (loaders,
// validate(), directive parsing). Each bound is far above every published configuration (the reason is given
// next to it) and low enough that products of bounded values cannot overflow int64 and that the graphs, plans
// and schedules built from them fit in memory. docs/reliability.md ("Input ranges: model, cluster, strategy and
// directive files") lists them with their reasons.
#pragma once

#include <cstdint>

namespace piper {

// --- model (ModelSpec) ---
inline constexpr int64_t kMaxLayers = 4096;           // deepest published: 128 (GPT-1T); a graph per layer
inline constexpr int64_t kMaxHiddenSize = 1 << 20;    // widest published: 18,432 (Nemotron-4 340B)
inline constexpr int64_t kMaxHeads = 1 << 16;         // most published: 128 (DeepSeek-V3, Llama-3 405B)
inline constexpr int64_t kMaxHeadDim = 1 << 16;       // published: 64..256
inline constexpr int64_t kMaxIntermediate = 1 << 22;  // widest published: 73,728 (Nemotron-4 340B)
inline constexpr int64_t kMaxVocab = 1 << 24;         // largest published: 262,144 (Gemma-3)
inline constexpr int64_t kMaxSeqLen = 1 << 24;        // longest published contexts: 10M tokens
inline constexpr int64_t kMaxExperts = 1 << 16;       // most published: 384 (Kimi K2); routers hold per-expert arrays
inline constexpr double kMaxRopeTheta = 1e12;         // largest published: 1e7 (Qwen2.5-1M)
inline constexpr double kMaxRoutedScaling = 1e6;      // published: 1..16
inline constexpr int64_t kMaxParams = 1000000000000000;  // 1e15 parameters: 600x the largest published (1.6T);
                                                         // keeps params x 16 bytes (AdamW state) inside int64
// Why, for messages: "model.num_layers: 10000 is out of range; allowed [1, 4096] (<why>)".
inline constexpr const char* kWhyLayers = "the deepest published model has 128";
inline constexpr const char* kWhyHidden = "the widest published is 18432";
inline constexpr const char* kWhyHeads = "published models have <= 128";
inline constexpr const char* kWhyHeadDim = "published models use 64..256";
inline constexpr const char* kWhyIntermediate = "the widest published is 73728";
inline constexpr const char* kWhyVocab = "the largest published is 262144";
inline constexpr const char* kWhySeqLen = "the longest published context is 10M tokens";
inline constexpr const char* kWhyExperts = "the most published is 384 per layer";
inline constexpr const char* kWhyRopeTheta = "the largest published is 1e7";

// --- training (TrainSpec) ---
inline constexpr int64_t kMaxMicroBatchSize = 1 << 16;    // sequences per microbatch
inline constexpr int64_t kMaxGlobalBatch = 1 << 24;       // sequences per step; published: <= 65,536; the
                                                          // trainer's per-step token buffers are sized by it
inline constexpr double kMaxLearningRate = 1.0;           // AdamW's peak lr; published 1e-5..1e-2, and above 1
                                                          // the loss diverges at once
inline constexpr int64_t kMaxMicrobatchTokens = 1 << 26;  // mbs * seq_len: 67M tokens per microbatch, so that
                                                          // per-microbatch FLOPs and bytes fit int64
// --- cluster (ClusterSpec) ---
inline constexpr int64_t kMaxDevicesPerNode = 1024;  // largest published box: 72 (GB200 NVL72); n x n link matrix
inline constexpr int64_t kMaxNodes = 1 << 17;        // 131,072 nodes
inline constexpr int64_t kMaxNodesPerDomain = 1024;  // nodes of one scale-up (NVLink) domain; NVL72: 18 trays
inline constexpr int64_t kMaxDevicesPerDomain = 4096;  // announced: 576 GPUs (Rubin Ultra NVL576)
inline constexpr int64_t kMaxWorldSize = 1 << 20;    // 1,048,576 ranks; largest published job: ~100,000 GPUs
inline constexpr double kMaxFlops = 1e18;            // FLOP/s per device; B200 fp8 dense: 4.5e15
inline constexpr int64_t kMaxMemoryBytes = int64_t{1} << 50;  // 1 PiB per device; published: <= 288 GB
inline constexpr double kMaxBandwidth = 1e15;                 // bytes/s per link or device memory; HBM3e: 8e12
inline constexpr double kMaxLatency = 1.0;                    // seconds per message; published: ~1e-6..1e-5
inline constexpr double kMaxTaper = 1e3;                      // oversubscription; published: 1..4
inline constexpr double kMaxSharedCores = 1 << 16;            // cores of one CPU node; the largest boxes: ~2,000
// --- strategy and directives ---
inline constexpr int64_t kMaxMicrobatches = 1 << 16;     // per step; published: <= 512 (GPT-1T on 3,072 GPUs)
inline constexpr int64_t kMaxVpp = 1024;                 // virtual stages per pipeline rank (layers bound it too)
inline constexpr int64_t kMaxPipelineActions = 1 << 20;  // microbatches * pp * chunks per rank: the schedule holds a
                                                         // forward and a backward action for each (32,768 for GPT-1T)
inline constexpr int64_t kMaxGraphNodes = 1 << 22;       // nodes of a split training graph (4.2M x ~0.5 KiB = 2 GiB)

}  // namespace piper
