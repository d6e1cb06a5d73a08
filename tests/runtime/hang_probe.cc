// A rank that stops answering mid-run: rank 1 trains one step, then hangs (sleeps far past the communication
// timeout) instead of entering step 2. Every other rank must stop within PIPER_COMM_TIMEOUT_S with an error that
// names rank 1; rank 0 prints it and aborts the job (CTest matches the message). Usage: hang_probe STRATEGY.
#include <unistd.h>

#include <cstdio>

#include "piper/base/check.h"
#include "piper/comm/mpi/mpi_communicator.h"
#include "piper/kernels/cpu/gemm.h"
#include "piper/runtime/trainer.h"
#include "piper/spec/model_loader.h"

int main(int argc, char** argv) {
  using namespace piper;
  PIPER_CHECK(argc == 2, "usage: hang_probe STRATEGY");
  PIPER_CHECK_OK(comm::mpi_init(&argc, &argv));
  kernels::set_kernel_threads(1);
  auto world = comm::mpi_world();
  PIPER_CHECK_OK(world.status());
  runtime::TrainOptions o;
  o.model = load_model("tiny-moe").value();
  o.strategy = argv[1];
  o.global_batch = 0;
  o.seq_len = 16;
  o.ranks = (*world)->size();
  o.world = world->get();
  auto trainer = runtime::Trainer::create(o);
  PIPER_CHECK_OK(trainer.status());
  auto first = (*trainer)->step();
  PIPER_CHECK_OK(first.status());
  const int rank = (*world)->rank();
  if (rank == 1) {
    std::fprintf(stderr, "rank 1: hanging instead of running step 2\n");
    sleep(120);
    return 1;
  }
  auto second = (*trainer)->step();
  if (second.ok()) {
    std::fprintf(stderr, "rank %d: step 2 completed although rank 1 never entered it\n", rank);
    comm::mpi_abort_job(1);
  }
  std::fprintf(stderr, "rank %d stopped: %s\n", rank, second.status().message().c_str());
  std::fflush(stderr);
  comm::mpi_abort_job(3);
}
