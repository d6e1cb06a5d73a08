// ApplyOptions::defer_order_cycle_checks (ir/passes/passes.h): one cycle check per run of order directives gives the
// graph of a check after every directive, and compile_directives reports the per-directive message when it fails.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "piper/compile/compile.h"
#include "piper/compile/strategy_directives.h"
#include "piper/ir/build_graph.h"
#include "piper/ir/passes/passes.h"
#include "piper/spec/model_loader.h"

namespace piper::compile {
namespace {

// Every node's tags, stream and order slot and every edge, as text: equal strings, equal graphs.
std::string dump(const ir::Graph& g) {
  std::string out;
  for (const ir::Node& n : g.nodes()) {
    out += n.name + "|" + n.stream + "|" + std::to_string(n.order_slot) + "|" + std::to_string(n.order_filter) + "|" +
           std::to_string(static_cast<int>(n.tags.pass)) + "|" + std::to_string(n.pp_rank) + "\n";
  }
  for (const ir::Edge& e : g.edges()) {
    out += std::to_string(e.src) + ">" + std::to_string(e.dst) + ":" + std::to_string(static_cast<int>(e.kind)) +
           (e.alive ? "" : " dead") + "\n";
  }
  return out;
}

TEST(DeferredCycleTest, StrategyOrdersGiveTheSameGraphWithOneCheck) {
  auto model = load_model("tiny-moe");
  ASSERT_TRUE(model.ok());
  for (const char* text : {"dp=1,pp=2,ep=1,schedule=dualpipev,microbatches=8,recompute=selective",
                           "dp=2,tp=2,pp=2,ep=2,sp=1,schedule=zb-h1,microbatches=4",
                           "dp=1,pp=2,vpp=2,schedule=interleaved,microbatches=4,zero=3",
                           "dp=2,pp=2,ep=2,schedule=1f1b,microbatches=6", "dp=1,pp=4,schedule=gpipe,microbatches=4"}) {
    auto s = Strategy::parse(text);
    ASSERT_TRUE(s.ok()) << s.status().message();
    TrainSpec t;
    t.seq_len = 64;
    t.global_batch = s->global_batch();
    auto mesh = strategy_mesh(*s, *model);
    ASSERT_TRUE(mesh.ok());
    auto directives = strategy_directives(*s, *model, DirectiveOptions{});
    ASSERT_TRUE(directives.ok()) << text << ": " << directives.status().message();
    std::string graphs[2];
    for (int defer = 0; defer < 2; ++defer) {
      auto g = ir::build_graph(*model, t, *mesh);
      ASSERT_TRUE(g.ok());
      ir::ApplyOptions o;
      o.verify_each = false;
      o.defer_order_cycle_checks = defer == 1;
      Status st = ir::apply_directives(*g, *directives, o);
      ASSERT_TRUE(st.ok()) << text << ": " << st.message();
      graphs[defer] = dump(*g);
    }
    EXPECT_EQ(graphs[0], graphs[1]) << text;
  }
}

// Two ranks whose rows contradict each other (rank 0 runs microbatch 0 first, rank 1 microbatch 1): the cycle
// appears with the second order directive. With the check deferred apply_directives only says that the run makes a
// cycle; compile_directives falls back to a check per directive and gives the message that names directive 6.
TEST(DeferredCycleTest, CyclicOrderGetsThePerDirectiveMessage) {
  auto model = load_model("tiny-moe");
  ASSERT_TRUE(model.ok());
  Json j = Json::parse(R"([
    {"directive": "split", "microbatches": 2},
    {"directive": "place", "filter": {"layer": "0-1"}, "stage": 0},
    {"directive": "place", "filter": {"layer": "2-3"}, "stage": 1},
    {"directive": "place", "filter": {"stage": 0}, "rank": 0},
    {"directive": "place", "filter": {"stage": 1}, "rank": 1},
    {"directive": "order", "rank": 0, "slots": ["0F0", "0BW0", "0F1", "0BW1"]},
    {"directive": "order", "rank": 1, "slots": ["1F1", "1BW1", "1F0", "1BW0"]}
  ])");
  auto directives = ir::directives_from_json(j, "user.json");
  ASSERT_TRUE(directives.ok()) << directives.status().message();
  ir::MeshInfo mesh;
  mesh.pp = 2;
  TrainSpec t;
  t.seq_len = 64;
  t.global_batch = 2;
  t.micro_batch_size = 1;
  std::string messages[2];
  for (int defer = 0; defer < 2; ++defer) {
    auto g = ir::build_graph(*model, t, mesh);
    ASSERT_TRUE(g.ok());
    ir::ApplyOptions o;
    o.verify_each = false;
    o.defer_order_cycle_checks = defer == 1;
    Status st = ir::apply_directives(*g, *directives, o);
    ASSERT_FALSE(st.ok());
    messages[defer] = st.message();
  }
  EXPECT_NE(messages[0].find("directive 6 (order)"), std::string::npos) << messages[0];
  EXPECT_NE(messages[0].find("cycle"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("order directives 5-6 make a cycle"), std::string::npos) << messages[1];
  CompileOptions copts;
  copts.verify_each_pass = false;
  auto r = compile_directives(*model, t, mesh, *directives, copts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "compile: passes: " + messages[0]);
}

}  // namespace
}  // namespace piper::compile
