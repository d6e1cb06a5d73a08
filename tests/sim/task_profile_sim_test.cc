// The simulator's task prices under a task profile (cost/task_profile.h): every compute instruction and update at
// its key's measured / priced, the experts' per-load price (expert_rank_loads) too, so the simulator and the
// closed form scale the same tasks.
#include <gtest/gtest.h>

#include <string>

#include "piper/compile/compile.h"
#include "piper/cost/estimate.h"
#include "piper/sim/task_time.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/counting.h"
#include "piper/spec/model_loader.h"

namespace piper::sim {
namespace {

// tiny-moe with every key of 1f1b at 1 thread measured at `f` x its price forward, `bw` backward, `u` the update.
cost::Calibration profiled(const ModelSpec& m, double f, double bw, double u) {
  Json points = Json::array();
  for (const char* chunk : {"embed", "attn", "router", "experts", "mlp", "head"}) {
    points.push_back(Json{{"threads", 1}, {"tokens", 256}, {"task", std::string(chunk) + ".F"}, {"calls", 1},
                          {"measured_s", f}, {"priced_s", 1.0}});
    points.push_back(Json{{"threads", 1}, {"tokens", 256}, {"task", std::string(chunk) + ".BW"}, {"calls", 1},
                          {"measured_s", bw}, {"priced_s", 1.0}});
  }
  points.push_back(Json{{"threads", 1}, {"tokens", 256}, {"task", "update"}, {"calls", 1}, {"measured_s", u},
                        {"priced_s", 1.0}});
  Json file{{"task_profiles", Json::array({Json{{"model", m.name},
                                                {"parameters", count_params(m).total()},
                                                {"seq", 128},
                                                {"points", points}}})}};
  cost::Calibration c = cost::Calibration::from_json(file, "cal.json").value();
  c.rank_threads = 1;
  return c;
}

TEST(TaskProfileSimTest, EveryTaskAndTheExpertsPerLoadPriceAtTheirScale) {
  const ModelSpec m = load_model("tiny-moe").value();
  const ClusterSpec cluster = load_cluster("local-cpu", 1).value();
  const Strategy s = Strategy::parse("dp=2,ep=2,microbatches=2,mbs=2").value();
  TrainSpec t;
  t.seq_len = 128;
  t.micro_batch_size = 2;
  t.global_batch = s.global_batch();
  cost::Calibration plain;
  plain.rank_threads = 1;
  const cost::Calibration scaled = profiled(m, 1.5, 0.8, 3.0);
  const cost::CostModel a = cost::CostModel::create(m, cluster, t, plain).value();
  const cost::CostModel b = cost::CostModel::create(m, cluster, t, scaled).value();
  const TaskTimeFn raw = cost_task_time(a, s, plain).value(), got = cost_task_time(b, s, scaled).value();
  const ExpertTimeFn raw_experts = cost_expert_time(a, s, plain).value();
  const ExpertTimeFn got_experts = cost_expert_time(b, s, scaled).value();
  const auto compiled = compile::compile_strategy(m, t, s).value();
  const compile::Program& program = compiled.plan.templates[0];
  int checked = 0, experts = 0;
  for (const compile::Stream& st : program.streams) {
    for (const compile::Instruction& in : st.instrs) {
      const double r = raw(program, in);
      if (!(r > 0)) continue;
      const double want = in.op == compile::OpKind::kUpdate ? 3.0 : in.pass == ir::Pass::kF ? 1.5 : 0.8;
      EXPECT_NEAR(got(program, in), want * r, 1e-12 * r) << in.label;
      ++checked;
      if (in.op == compile::OpKind::kCompute && in.part == Part::kExperts) {
        EXPECT_NEAR(got_experts(in, 2.0), want * raw_experts(in, 2.0), 1e-12 * r) << in.label;
        ++experts;
      }
    }
  }
  EXPECT_GT(checked, 20);
  EXPECT_EQ(experts, 2 * 2 * 3);  // F and BW per microbatch, 3 MoE layers
}

}  // namespace
}  // namespace piper::sim
