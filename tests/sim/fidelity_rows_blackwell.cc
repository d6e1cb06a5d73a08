// The Blackwell-class rows (issue 32; moved here from fidelity_blackwell_test.cc so that `make fidelity` reports
// them and CTest asserts them from one table).
//
// Every row is a Megatron-Bridge pre-training run (NeMo 25.11 container) from the performance summary,
// github.com/NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md ("25.11 NeMo Container", DGX-GB300,
// DGX-GB200 and DGX-B200 tables; MoE rows with forced-balanced, dropless routing). The table gives the full
// layout (GPUs, precision, GBS, MBS, sequence length, TP, PP, VP, EP) and tokens/s per GPU; the published step
// time is GBS x seq / (tokens/s/GPU x GPUs). Piper lays the runs out as Megatron does: TP innermost, the expert
// mesh folded over each stage's tp x dp ranks (fold=1), the distributed optimizer (zero=1), interleaved 1F1B
// when VP > 1. FP8-MX rows run --precision mxfp8 with the dispatch in bf16 (Megatron-Core quantises inside the
// expert GEMMs; its all-to-all carries bf16 unless an fp8 dispatcher is configured, which the recipes do not
// state) [inferred]. Presets as shipped (configs/clusters: gb200-nvl72, gb300-nvl72, b200) with the default
// calibration. GB200/GB300 jobs fill 16 trays (64 GPUs) of each NVL72 rack, as NVIDIA's Slurm block scheduling
// allocates them [inferred: the tables do not state the placement]. No constant is fitted to these rows.
//
// Bands. A row the model covers must lie within 15 % of the published step time (simulated and closed form).
// Rows outside are open gaps: each names its reason and is reported, not asserted green; the test asserts they
// stay outside the 15 % band (a row that moves in is noticed) and inside [0.2, 3] (a model that breaks).

#include <cstdio>
#include <string>

#include "fidelity_rows.h"
#include "piper/spec/cluster_loader.h"

namespace piper::fidelity {
namespace {

struct BlackwellRow {
  const char* name;
  const char* source;
  const char* cluster;  // preset
  int gpus;
  const char* model;
  Precision precision;
  int64_t global_batch;
  int64_t seq_len;
  const char* strategy;
  double published_tokens_per_s_per_gpu;
  const char* gap;  // nullptr: covered (within 15 %); else why the row is an open gap
};

constexpr const char* kBridge = "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, 25.11 NeMo container";

// Why the model runs ahead of these rows (the same gaps as H100 rows C and E of moe_fidelity_test.cc; see
// docs/simulator.md "Blackwell rows"): Megatron-Core's per-layer MoE work that the model does not cost (router
// and permutation kernels, dropless token counts synchronised to the host, kernel launches), and a GEMM
// efficiency (0.8 of peak, the NVIDIA presets' default) that no Blackwell measurement backs: the published
// DeepSeek-V3 runs reach 782-1088 model TFLOP/s per GPU, 31-44 % of the bf16 peak. A measured Blackwell GEMM
// table (issue 33) or a GPU run is needed to close them; nothing here is fitted.
constexpr const char* kMoeOverheads =
    "Megatron MoE per-layer overheads (router, permute, host-synchronised dropless counts, launches) not "
    "modelled; Blackwell GEMM efficiency unmeasured (0.8 preset default)";
constexpr const char* kSmallMoe =
    "3B active parameters on 8 GPUs: launch- and host-bound (the B200 row at MBS 1 runs 2.6x slower than GB200 at "
    "MBS 4), not modelled; plus the MoE overheads above";
constexpr const char* kGptOss =
    "as H100 row E: gpt-oss's sliding-window/sink attention and MoE kernels far below the model's efficiency; "
    "MoE overheads not modelled";

const BlackwellRow kRows[] = {
    {"GB200 DeepSeek-V3 BF16", "DGX-GB200 table: 256 GPUs, BF16, GBS 4096, MBS 1, 4096, TP1 PP4 VP4 EP64, 3139",
     "gb200-nvl72", 256, "deepseek-v3", Precision::kBF16, 4096, 4096,
     "dp=64,tp=1,pp=4,vpp=4,ep=64,fold=1,zero=1,mbs=1,microbatches=64,recompute=none,schedule=interleaved", 3139,
     kMoeOverheads},
    {"GB200 DeepSeek-V3 MXFP8", "DGX-GB200 table: 256 GPUs, FP8-MX, GBS 4096, MBS 1, 4096, TP1 PP8 VP4 EP32, 4018",
     "gb200-nvl72", 256, "deepseek-v3", Precision::kMXFP8, 4096, 4096,
     "dp=32,tp=1,pp=8,vpp=4,ep=32,fold=1,zero=1,mbs=1,microbatches=128,recompute=none,schedule=interleaved", 4018,
     kMoeOverheads},
    {"GB300 DeepSeek-V3 BF16", "DGX-GB300 table: 256 GPUs, BF16, GBS 4096, MBS 1, 4096, TP1 PP2 VP4 EP32, 3848",
     "gb300-nvl72", 256, "deepseek-v3", Precision::kBF16, 4096, 4096,
     "dp=128,tp=1,pp=2,vpp=4,ep=32,fold=1,zero=1,mbs=1,microbatches=32,recompute=none,schedule=interleaved", 3848,
     kMoeOverheads},
    {"GB300 DeepSeek-V3 MXFP8", "DGX-GB300 table: 256 GPUs, FP8-MX, GBS 4096, MBS 1, 4096, TP1 PP2 VP4 EP32, 4357",
     "gb300-nvl72", 256, "deepseek-v3", Precision::kMXFP8, 4096, 4096,
     "dp=128,tp=1,pp=2,vpp=4,ep=32,fold=1,zero=1,mbs=1,microbatches=32,recompute=none,schedule=interleaved", 4357,
     kMoeOverheads},
    {"B200 DeepSeek-V3 MXFP8", "DGX-B200 table: 256 GPUs, FP8-MX, GBS 2048, MBS 1, 4096, TP1 PP16 VP1 EP8, 2139",
     "b200", 256, "deepseek-v3", Precision::kMXFP8, 2048, 4096,
     "dp=16,tp=1,pp=16,ep=8,fold=1,zero=1,mbs=1,microbatches=128,recompute=none,schedule=1f1b", 2139, kMoeOverheads},
    {"GB200 Qwen3-235B BF16", "DGX-GB200 table: 256 GPUs, BF16, GBS 8192, MBS 1, 4096, TP1 PP8 VP3 EP32, 4916",
     "gb200-nvl72", 256, "qwen3-235b-a22b", Precision::kBF16, 8192, 4096,
     "dp=32,tp=1,pp=8,vpp=3,ep=32,fold=1,zero=1,mbs=1,microbatches=256,recompute=none,schedule=interleaved", 4916,
     kMoeOverheads},
    {"GB300 Qwen3-235B BF16", "DGX-GB300 table: 256 GPUs, BF16, GBS 8192, MBS 2, 4096, TP1 PP4 VP12 EP16, 6131",
     "gb300-nvl72", 256, "qwen3-235b-a22b", Precision::kBF16, 8192, 4096,
     "dp=64,tp=1,pp=4,vpp=12,ep=16,fold=1,zero=1,mbs=2,microbatches=64,recompute=none,schedule=interleaved", 6131,
     nullptr},
    {"B200 Qwen3-235B MXFP8", "DGX-B200 table: 64 GPUs, FP8-MX, GBS 1024, MBS 1, 4096, TP1 PP8 VP2 EP8, 3269", "b200",
     64, "qwen3-235b-a22b", Precision::kMXFP8, 1024, 4096,
     "dp=8,tp=1,pp=8,vpp=2,ep=8,fold=1,zero=1,mbs=1,microbatches=128,recompute=none,schedule=interleaved", 3269,
     kMoeOverheads},
    {"GB200 Qwen3-30B-A3B MXFP8", "DGX-GB200 table: 8 GPUs, FP8-MX, GBS 512, MBS 4, 4096, TP1 PP1 EP8, 23766",
     "gb200-nvl72", 8, "qwen3-30b-a3b", Precision::kMXFP8, 512, 4096,
     "dp=8,tp=1,pp=1,ep=8,fold=1,zero=1,mbs=4,microbatches=16,recompute=none,schedule=1f1b", 23766, kSmallMoe},
    {"B200 Qwen3-30B-A3B MXFP8", "DGX-B200 table: 8 GPUs, FP8-MX, GBS 512, MBS 1, 4096, TP1 PP1 EP8, 9299", "b200", 8,
     "qwen3-30b-a3b", Precision::kMXFP8, 512, 4096,
     "dp=8,tp=1,pp=1,ep=8,fold=1,zero=1,mbs=1,microbatches=64,recompute=none,schedule=1f1b", 9299, kSmallMoe},
    {"GB200 gpt-oss-120b BF16", "DGX-GB200 table: 64 GPUs, BF16, GBS 1280, MBS 1, 8192, TP1 PP1 EP64, 15876",
     "gb200-nvl72", 64, "gpt-oss-120b", Precision::kBF16, 1280, 8192,
     "dp=64,tp=1,pp=1,ep=64,fold=1,zero=1,mbs=1,microbatches=20,recompute=none,schedule=1f1b", 15876, kGptOss},
    {"B200 gpt-oss-120b BF16", "DGX-B200 table: 64 GPUs, BF16, GBS 512, MBS 4, 4096, TP1 PP1 EP8, 8213", "b200", 64,
     "gpt-oss-120b", Precision::kBF16, 512, 4096,
     "dp=64,tp=1,pp=1,ep=8,fold=1,zero=1,mbs=4,microbatches=2,recompute=none,schedule=1f1b", 8213, kGptOss},
};

}  // namespace

std::vector<Row> blackwell_rows() {
  std::vector<Row> rows;
  for (const BlackwellRow& b : kRows) {
    Row r;
    r.table = "blackwell";
    r.name = b.name;
    r.source = std::string(kBridge) + ", " + b.source;
    r.model = b.model;
    r.cluster = b.cluster;
    auto preset = load_cluster(b.cluster, 1);
    r.nodes = preset.ok() ? b.gpus / preset->node.devices_per_node : 0;  // evaluate() names a bad preset
    r.strategy = b.strategy;
    r.global_batch = b.global_batch;
    r.seq_len = b.seq_len;
    r.published_step_s = static_cast<double>(b.global_batch * b.seq_len) / (b.published_tokens_per_s_per_gpu * b.gpus);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.0f tokens/s per GPU", b.published_tokens_per_s_per_gpu);
    r.published = buf;
    r.lo = 0.85;  // a covered row: within 15 % (docs/simulator.md, "Blackwell rows")
    r.hi = 1.15;
    r.precision = b.precision;
    r.bf16_dispatch = b.precision != Precision::kBF16;  // see the header
    r.job_nodes_per_domain = 16;                        // 16 trays of each NVL72 rack (see the header)
    r.check_fits = false;                               // the published runs' memory is not what these rows check
    r.slow = b.gpus >= 256;
    if (b.gap != nullptr) {
      r.status = RowStatus::kOpenGap;
      r.note = b.gap;
    }
    rows.push_back(r);
  }
  return rows;
}

}  // namespace piper::fidelity
