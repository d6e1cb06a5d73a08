// `piper train --device cuda` (see train_gpu.h).
#include <cstdio>

#include "piper/base/json.h"
#include "piper/cli/train_gpu.h"
#include "piper/runtime/gpu/gpu_trainer.h"

namespace piper::cli {

Status check_gpu_train_flags(int ranks, const std::string& strategy, bool save, bool resume, bool trace) {
  if (ranks > 1) {
    return invalid_argument("--device cuda trains on one GPU; --ranks " + std::to_string(ranks) +
                            " is not supported yet (multi-GPU training: issue 11)");
  }
  if (strategy == "auto") return invalid_argument("--device cuda: --strategy auto plans CPU ranks; drop it");
  if (save || resume) return invalid_argument("--device cuda: --save/--resume are not supported yet; drop them");
  if (trace) return invalid_argument("--device cuda: --trace is not supported yet; drop it");
  return ok_status();
}

Status train_gpu(const runtime::TrainOptions& options, int64_t steps, bool json) {
  PIPER_ASSIGN_OR_RETURN(auto trainer, runtime::GpuTrainer::create(options));
  if (!json) {
    std::printf("device    %s (cuda: bf16 GEMMs, fp32 master weights)\n", trainer->device().c_str());
    std::printf("batch     %lld sequences x %lld tokens, %d microbatches of %lld\n",
                static_cast<long long>(options.global_batch), static_cast<long long>(options.seq_len),
                trainer->microbatches(), static_cast<long long>(trainer->mbs()));
  }
  Json out_steps = Json::array();
  double loss_first = 0, loss_last = 0, seconds = 0;
  for (int64_t i = 0; i < steps; ++i) {
    PIPER_ASSIGN_OR_RETURN(runtime::TrainStepStats s, trainer->step());
    if (i == 0) loss_first = s.loss;
    loss_last = s.loss;
    seconds += s.seconds;
    out_steps.push_back(Json{{"step", s.step},
                             {"loss", s.loss},
                             {"aux_loss", s.aux_loss},
                             {"grad_norm", s.grad_norm},
                             {"seconds", s.seconds}});
    if (!json) {
      std::printf("step %5lld  loss %.4f  aux %.4f  |g| %.3f  %8.0f tok/s  %.3f s\n", static_cast<long long>(s.step),
                  s.loss, s.aux_loss, s.grad_norm, s.tokens_per_s, s.seconds);
      std::fflush(stdout);
    }
  }
  if (json) {
    const Json j{{"device", "cuda"},         {"gpu", trainer->device()}, {"steps", out_steps},
                 {"loss_first", loss_first}, {"loss_last", loss_last},   {"seconds", seconds}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("loss %.4f -> %.4f in %lld steps, %.2f s\n", loss_first, loss_last, static_cast<long long>(steps),
                seconds);
  }
  return ok_status();
}

}  // namespace piper::cli
