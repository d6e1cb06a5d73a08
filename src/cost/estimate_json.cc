#include "piper/cost/estimate.h"

namespace piper::cost {
namespace {

Json memory_json(const MemoryBreakdown& m) {
  return Json{{"params", m.params},           {"grads", m.grads},     {"optimizer", m.optimizer},
              {"activations", m.activations}, {"buffers", m.buffers}, {"total", m.total()}};
}

}  // namespace

Json Estimate::to_json() const {
  Json ranks_json = Json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    Json j = memory_json(ranks[r]);
    j["pp_rank"] = r;
    ranks_json.push_back(j);
  }
  return Json{{"fits", fits},
              {"step_time_s", step_time_s},
              {"mfu", mfu},
              {"tokens_per_s", tokens_per_s},
              {"tokens_per_step", tokens_per_step},
              {"device_memory_bytes", device_memory_bytes},
              {"worst_rank", worst_rank},
              {"bottleneck_rank", bottleneck_rank},
              {"memory", memory_json(memory)},
              {"ranks", ranks_json},
              {"time",
               {{"compute", time.compute_s},
                {"exposed_comm", time.exposed_comm_s},
                {"bubble", time.bubble_s},
                {"optimizer", time.optimizer_s}}},
              {"exposed_comm", {{"tp", comm.tp_s}, {"ep", comm.ep_s}, {"pp", comm.pp_s}, {"dp", comm.dp_s}}},
              {"microbatch", {{"t_f_s", t_f_s}, {"t_b_s", t_b_s}, {"t_w_s", t_w_s}}}};
}

}  // namespace piper::cost
