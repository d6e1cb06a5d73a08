// Property: every strategy the compiler verifies trains with one rank's losses. Strategies are drawn at random
// (seeded, the same list on every rank) from the planner's dimensions (planner/space.h: tp, pp, ep, schedule with
// vpp, zero, recompute, a2a, mbs; the disaggregated mode's attention:FFN splits), Megatron's module
// recomputation (recompute_modules), MoE parallel folding (fold=1: ep over the stage's tp*dp ranks) and tp
// communication overlap (tp_overlap=1) for tiny-moe on the run's world; each draw must validate
// (Strategy::validate_for) and be runnable (check_runnable, which refuses nothing). Every drawn strategy trains 3
// steps (Trainer::create compiles and verifies it), and each step's loss must be within 1e-5 (relative) of one rank
// with the same global batch and micro-batch size. The first draws cover the compositions named by issue 26, where
// the world allows them: tp x ep, dualpipev x ep x zero=3, interleaved pp=2 vpp=2, zb-h1 with ep, uneven af-pipe
// (tp=1) with ZeRO and recomputation; then tp=2 x ep folded (every world), tp=2 x ep x etp=2 (4 and 8 ranks), and
// af-pipe with tp=2, sp=1 (etp=1, which disagg=1 needs) on a split the world allows, drawn from its own stream
// (af_tp2_splits): dp=1 on 4 ranks (2:2) and 8 ranks (2:6, 4:4 pp=2, 6:2), dp=2 with ep 1 or 2 on 8 ranks (4:4);
// these take the places of the last free draws. A later draw with tp > 1 folds with probability 1/2 (ep then among
// the divisors > 1 of tp*dp); folding draws from its own stream, so a seed's other dimensions are drawn as before
// folding was (draw_strategies). Expert tensor parallelism likewise: on 4 and 8 ranks a "tp_ep_etp" draw (tp=2 x ep,
// etp=2), and a later unfolded draw with tp > 1 slices its experts (etp = tp) with probability 1/2 from its own
// stream, with ep > 1 or ep = 1 (the etp exchanges alone). Any draw with tp > 1 (all have sp=1) then runs its tp
// chunks as overlapped pieces (tp_overlap=1) with probability 1/2, again from its own stream: the draw takes the
// place of the same strategy without it. The run prints how many of its strategies fold, slice experts, overlap tp
// and are af-pipe (with tp > 1), with the worst loss difference of the overlapped and of the af-pipe tp draws.
// PIPER_PROPERTY_DRAWS sets the number of draws (CTest: a small draw per world in `make test`, a larger one under
// `ctest -C property-large`); PIPER_PROPERTY_SEED the seed. Run under mpiexec -n 2, 4 or 8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dist_test_util.h"
#include "piper/comm/mpi/mpi_communicator.h"
#include "piper/runtime/support.h"

namespace piper::runtime::testing {
namespace {

constexpr int kSteps = 3;
constexpr double kRelTol = 1e-5;
constexpr double kLr = 1e-3;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

template <typename T>
T pick(std::mt19937_64& rng, const std::vector<T>& values) {
  return values[static_cast<size_t>(rng() % values.size())];
}

std::vector<int> divisors(int n, int at_most) {
  std::vector<int> out;
  for (int d = 1; d <= n && d <= at_most; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// One draw: the strategy text (pipeline-parallel or af-pipe), its global batch, its tp and whether it folds.
struct Draw {
  std::string strategy;
  int64_t global_batch = 0;
  int mbs = 1;
  int tp = 1;
  bool fold = false;
  bool etp = false;      // etp = tp (expert tensor parallelism), unfolded, any ep
  bool af = false;       // af-pipe (disagg=1)
  bool overlap = false;  // tp_overlap=1
};

// An af-pipe attention:FFN split with tp=2: pp attention and f FFN pipeline ranks, each run by dp*tp ranks.
struct AfSplit {
  int dp, pp, f;
};
constexpr int kAfTp = 2;

// The splits, even (f = pp) or uneven, of `world` ranks with tp=2 and `dp`: attn_ranks = dp*tp*pp, ffn_ranks =
// f*dp*tp (the compiler's grammar), at most tiny-moe's 4 layers on either side. np4: dp=1 gives 2:2; np8: dp=1 gives
// 2:6, 4:4 (pp=2) and 6:2, dp=2 gives 4:4; np2 none.
std::vector<AfSplit> af_tp2_splits(int world, int dp) {
  std::vector<AfSplit> splits;
  const int width = dp * kAfTp;
  for (int pp = 1; pp <= 4; ++pp) {
    const int ffn = world - width * pp;
    if (ffn > 0 && ffn % width == 0 && ffn / width <= 4) splits.push_back({dp, pp, ffn / width});
  }
  return splits;
}

// af-pipe with tp=2 on one of af_tp2_splits(world, dp): sp=1 (MoE with tp > 1 needs it), etp=1 (disagg=1 needs
// it), ep dividing dp (each tp slice of an FFN pipeline rank shards its experts over ep), zero, recompute and modules
// as drawn by draw_one.
Draw draw_af_tp2(std::mt19937_64& rng, int world, int dp, int mbs, const std::string& zero, const std::string& rc,
                 const std::string& modules) {
  const AfSplit s = pick(rng, af_tp2_splits(world, dp));
  const int ep = pick(rng, divisors(s.dp, 8));
  const int m = pick(rng, std::vector<int>{2, 4});
  Draw d;
  d.mbs = mbs;
  d.tp = kAfTp;
  d.af = true;
  d.strategy = "dp=" + std::to_string(s.dp) + ",tp=2,sp=1,ep=" + std::to_string(ep) + ",pp=" + std::to_string(s.pp) +
               ",schedule=af-pipe,disagg=1,attn_ranks=" + std::to_string(s.dp * kAfTp * s.pp) +
               ",ffn_ranks=" + std::to_string(s.f * s.dp * kAfTp) + ",zero=" + zero + ",recompute=" + rc +
               (rc == "full" ? "" : modules) + ",microbatches=" + std::to_string(m) + ",mbs=" + std::to_string(mbs);
  d.global_batch = static_cast<int64_t>(s.dp) * m * mbs;
  return d;
}

// The planner's dimensions on `world` ranks of tiny-moe (4 layers, 4 heads / 2 kv heads, 8 experts). `kind`
// constrains the draw to one composition: "" any, "tp_ep", "dualpipev_ep_zero3", "interleaved_pp2_vpp2",
// "zbh1_ep", "af_uneven" (af-pipe, tp=1), "af_tp2_dp1" / "af_tp2_dp2" (af-pipe, tp=2: draw_af_tp2). With `fold_rng` and
// tp > 1 the draw folds (fold=1): ep is drawn from fold_rng among the divisors > 1 of tp*dp (Megatron's MoE parallel
// folding lays the expert groups over the stage's tp*dp ranks).
Draw draw_one(std::mt19937_64& rng, int world, const std::string& kind, std::mt19937_64* fold_rng = nullptr) {
  Draw d;
  d.mbs = pick(rng, std::vector<int>{1, 2});
  const std::string zero = std::to_string(pick(rng, std::vector<int>{0, 1, 2, 3}));
  const std::string rc = pick(rng, std::vector<std::string>{"none", "selective", "full"});
  // Module recomputation (the draw with recompute=full is not valid and is drawn again).
  static const std::vector<std::string> kModules = {
      "", "", ",recompute_modules=layernorm", ",recompute_modules=moe_act", ",recompute_modules=layernorm+moe_act"};
  if (kind == "af_uneven") {
    // Uneven attention:FFN splits the world allows (every pipeline rank on dp ranks).
    struct Split {
      int dp, pp, ffn;
    };
    std::vector<Split> splits;
    for (int dp : divisors(world, world)) {
      for (int pp = 1; pp <= 4; ++pp) {
        const int ffn = world - dp * pp;
        if (ffn > 0 && ffn % dp == 0 && ffn != dp * pp && ffn / dp <= 4) splits.push_back({dp, pp, ffn});
      }
    }
    const Split s = pick(rng, splits);
    const int ep = pick(rng, divisors(s.dp, 8));
    const int m = pick(rng, std::vector<int>{2, 4});
    const std::string z = s.dp > 1 ? std::to_string(pick(rng, std::vector<int>{1, 2, 3})) : "0";
    const std::string modules = pick(rng, kModules);
    d.strategy = "dp=" + std::to_string(s.dp) + ",ep=" + std::to_string(ep) + ",pp=" + std::to_string(s.pp) +
                 ",schedule=af-pipe,disagg=1,attn_ranks=" + std::to_string(s.dp * s.pp) +
                 ",ffn_ranks=" + std::to_string(s.ffn) + ",zero=" + z +
                 ",recompute=" + pick(rng, std::vector<std::string>{"selective", "full"}) + modules +
                 ",microbatches=" + std::to_string(m) + ",mbs=" + std::to_string(d.mbs);
    d.global_batch = static_cast<int64_t>(s.dp) * m * d.mbs;
    d.af = true;
    return d;
  }
  if (kind.rfind("af_tp2_dp", 0) == 0) {
    const std::string modules = pick(rng, kModules);
    return draw_af_tp2(rng, world, std::stoi(kind.substr(9)), d.mbs, zero, rc, modules);
  }
  const bool want_ep = kind == "tp_ep" || kind == "dualpipev_ep_zero3" || kind == "zbh1_ep";
  int tp = kind == "tp_ep" ? 2 : want_ep ? 1 : pick(rng, divisors(world, 2));
  int pp = kind == "tp_ep" ? 1 : want_ep || kind == "interleaved_pp2_vpp2" ? 2 : pick(rng, divisors(world / tp, 4));
  std::string schedule = pick(rng, std::vector<std::string>{"1f1b", "gpipe", "interleaved", "zb-h1", "dualpipev"});
  if (kind == "dualpipev_ep_zero3") schedule = "dualpipev";
  if (kind == "interleaved_pp2_vpp2") schedule = "interleaved";
  if (kind == "zbh1_ep") schedule = "zb-h1";
  if (world % (tp * pp) != 0) pp = 1;
  const int dp = world / (tp * pp);
  std::vector<int> eps = divisors(dp, 8);
  if (want_ep && eps.size() > 1) eps.erase(eps.begin());  // ep > 1
  int ep = pick(rng, eps);
  d.tp = tp;
  d.fold = fold_rng != nullptr && tp > 1;
  if (d.fold) {
    std::vector<int> folded = divisors(dp * tp, 8);
    folded.erase(folded.begin());  // ep > 1
    ep = pick(*fold_rng, folded);
  }
  const int vpp = schedule == "interleaved" ? 2 : 1;
  // Microbatches: the schedules' minimums (1f1b, zb-h1, interleaved >= pp, interleaved a multiple of pp,
  // dualpipev >= 2 pp), one or two times that.
  const int base = schedule == "dualpipev" ? 2 * pp : std::max(1, pp);
  const int m = base * pick(rng, std::vector<int>{1, 2});
  d.strategy = "dp=" + std::to_string(dp) + ",tp=" + std::to_string(tp) + ",pp=" + std::to_string(pp) +
               ",ep=" + std::to_string(ep) + (tp > 1 ? ",sp=1" : "") + ",schedule=" + schedule +
               (vpp > 1 ? ",vpp=2" : "") + ",zero=" + (kind == "dualpipev_ep_zero3" ? "3" : zero) + ",recompute=" + rc +
               (rc == "full" ? "" : pick(rng, kModules)) +
               ",a2a=" + (ep > 1 ? pick(rng, std::vector<std::string>{"flat", "halo"}) : "flat") +
               ",microbatches=" + std::to_string(m) + ",mbs=" + std::to_string(d.mbs) + (d.fold ? ",fold=1" : "");
  d.global_batch = static_cast<int64_t>(dp) * m * d.mbs;
  return d;
}

// Whether the draw is one the compiler verifies and the runtime runs (validate_for, check_runnable).
bool admissible(const Draw& d, int world) {
  auto s = Strategy::parse(d.strategy);
  if (!s.ok()) return false;
  TrainOptions o = tiny_moe_options(d.strategy, kLr);
  TrainSpec train;
  train.global_batch = d.global_batch;
  train.micro_batch_size = d.mbs;
  train.seq_len = o.seq_len;
  if (!s->validate_for(o.model, train, world).ok()) return false;
  return check_runnable(*s).ok();
}

// `d` with its experts sliced over the tensor ranks (etp = tp).
Draw with_etp(Draw d) {
  d.strategy += ",etp=" + std::to_string(d.tp);
  d.etp = true;
  return d;
}

// `d` with its tp chunks run as pieces overlapped with their collectives (tp > 1, sp=1).
Draw with_tp_overlap(Draw d) {
  d.strategy += ",tp_overlap=1";
  d.overlap = true;
  return d;
}

// The first draws are the kinds (above), then "tp_ep_fold" (tp=2, pp=1, folded), then free draws. Folding has its
// own stream (fold_rng): "tp_ep_fold" is drawn from it whole, and a free draw with tp > 1 folds with probability
// 1/2 by replaying the main stream's draw with fold=1 (kept when admissible, else the unfolded draw stands). The
// main stream advances as without folding, so a seed draws the other dimensions as it did before fold was drawn.
// Last, a new admissible draw with tp > 1 overlaps tp (tp_overlap=1) with probability 1/2 from overlap_rng (kept
// when admissible): the seed's strategies are the same but for that flag.
std::vector<Draw> draw_strategies(int world, int count, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(world));
  std::mt19937_64 fold_rng(seed * 1000033u + static_cast<uint64_t>(world) + 7u);
  std::mt19937_64 etp_rng(seed * 1000037u + static_cast<uint64_t>(world) + 11u);
  std::mt19937_64 af_rng(seed * 1000039u + static_cast<uint64_t>(world) + 13u);
  std::mt19937_64 overlap_rng(seed * 1000081u + static_cast<uint64_t>(world) + 17u);
  std::vector<std::string> kinds = {"interleaved_pp2_vpp2"};
  if (world >= 4) {
    for (const char* k : {"tp_ep", "dualpipev_ep_zero3", "zbh1_ep", "af_uneven"}) kinds.push_back(k);
  }
  kinds.push_back("tp_ep_fold");
  if (world >= 4) kinds.push_back("tp_ep_etp");
  for (int dp : {1, 2}) {
    if (!af_tp2_splits(world, dp).empty()) kinds.push_back("af_tp2_dp" + std::to_string(dp));
  }
  std::vector<Draw> out;
  std::vector<std::string> drawn;  // the strategies of `out` without tp_overlap
  for (int i = 0, tries = 0; static_cast<int>(out.size()) < count && tries < 100000; ++tries) {
    const std::string kind = i < static_cast<int>(kinds.size()) ? kinds[static_cast<size_t>(i)] : "";
    Draw d;
    if (kind == "tp_ep_fold") {
      d = draw_one(fold_rng, world, "tp_ep", &fold_rng);
    } else if (kind == "tp_ep_etp") {
      d = with_etp(draw_one(etp_rng, world, "tp_ep"));
    } else if (kind.rfind("af_tp2", 0) == 0) {
      d = draw_one(af_rng, world, kind);
    } else {
      std::mt19937_64 replay = rng;
      d = draw_one(rng, world, kind);
      if (kind.empty() && d.tp > 1 && fold_rng() % 2 == 0) {
        Draw f = draw_one(replay, world, kind, &fold_rng);
        if (admissible(f, world)) d = f;
      }
      // Unfolded with tp > 1: etp = tp with probability 1/2 from its own stream (kept when admissible).
      if (kind.empty() && d.tp > 1 && !d.fold && etp_rng() % 2 == 0) {
        Draw e = with_etp(d);
        if (admissible(e, world)) d = e;
      }
    }
    if (!admissible(d, world)) continue;
    if (std::find(drawn.begin(), drawn.end(), d.strategy) != drawn.end()) continue;
    drawn.push_back(d.strategy);
    if (d.tp > 1 && overlap_rng() % 2 == 0) {
      Draw o = with_tp_overlap(d);
      if (admissible(o, world)) d = o;
    }
    out.push_back(d);
    ++i;
  }
  return out;
}

std::vector<double> losses(const TrainOptions& o, int steps) {
  auto t = Trainer::create(o);
  EXPECT_TRUE(t.ok()) << o.strategy << ": " << t.status().to_string();
  if (!t.ok()) return {};
  std::vector<double> out;
  for (const TrainStepStats& s : train_steps(**t, steps)) out.push_back(s.loss);
  return out;
}

TEST(StrategyProperty, DrawnStrategiesTrainWithOneRanksLosses) {
  auto world = comm::mpi_world();
  ASSERT_TRUE(world.ok()) << world.status().to_string();
  const int ranks = (*world)->size();
  const int count = env_int("PIPER_PROPERTY_DRAWS", 10);
  const uint64_t seed = static_cast<uint64_t>(env_int("PIPER_PROPERTY_SEED", 26));
  const std::vector<Draw> draws = draw_strategies(ranks, count, seed);
  ASSERT_EQ(static_cast<int>(draws.size()), count) << "fewer admissible strategies than draws on " << ranks;
  double worst = 0;
  int folded = 0, sliced = 0, overlapped = 0, af = 0, af_tp = 0;
  double worst_overlap = 0, worst_af_tp = 0;
  for (const Draw& d : draws) {
    folded += d.fold;
    sliced += d.etp;
    overlapped += d.overlap;
    af += d.af;
    af_tp += d.af && d.tp > 1;
    TrainOptions o = tiny_moe_options(d.strategy, kLr);
    o.ranks = ranks;
    o.world = world->get();
    const std::vector<double> got = losses(o, kSteps);
    ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << d.strategy;
    std::vector<double> ref(kSteps, 0.0);
    if ((*world)->rank() == 0) {
      const std::string one =
          "microbatches=" + std::to_string(d.global_batch / d.mbs) + ",mbs=" + std::to_string(d.mbs);
      const std::vector<double> r = losses(tiny_moe_options(one, kLr), kSteps);
      ASSERT_EQ(r.size(), static_cast<size_t>(kSteps)) << one;
      ref = r;
    }
    std::vector<double> all(ref.size() * static_cast<size_t>(ranks));
    auto h = (*world)->all_gather(ref.data(), all.data(), ref.size() * sizeof(double));
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE((*world)->wait(*h, 300).ok());
    ref.assign(all.begin(), all.begin() + kSteps);  // rank 0's block
    double rel = 0;
    for (int i = 0; i < kSteps; ++i) {
      rel = std::max(rel, std::abs(got[static_cast<size_t>(i)] - ref[static_cast<size_t>(i)]) /
                              std::abs(ref[static_cast<size_t>(i)]));
    }
    worst = std::max(worst, rel);
    if (d.overlap) worst_overlap = std::max(worst_overlap, rel);
    if (d.af && d.tp > 1) worst_af_tp = std::max(worst_af_tp, rel);
    if ((*world)->rank() == 0) std::printf("property %-110s max rel %.3g\n", d.strategy.c_str(), rel);
    EXPECT_LE(rel, kRelTol) << d.strategy << " on " << ranks << " ranks: losses differ from one rank's";
  }
  if ((*world)->rank() == 0) {
    std::printf(
        "property: %zu strategies on %d ranks (%d with fold=1, %d with etp > 1, %d with tp_overlap=1: worst %.3g, "
        "%d af-pipe of which %d with tp > 1: worst %.3g), worst relative loss difference %.3g\n",
        draws.size(), ranks, folded, sliced, overlapped, worst_overlap, af, af_tp, worst_af_tp, worst);
  }
}

}  // namespace
}  // namespace piper::runtime::testing
