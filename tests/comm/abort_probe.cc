// A job in which rank 1 fails a PIPER_CHECK while rank 0 waits for a message from it for 60 s. The fatal hook
// that mpi_init() registers must abort the whole job at once (CTest looks for the CHECK report and
// fails the test if the job is still running after its timeout).
#include <cstdio>

#include "piper/base/check.h"
#include "piper/comm/mpi/mpi_communicator.h"

int main(int argc, char** argv) {
  PIPER_CHECK_OK(piper::comm::mpi_init(&argc, &argv));
  auto world = piper::comm::mpi_world();
  PIPER_CHECK_OK(world.status());
  if ((*world)->rank() == 1) {
    PIPER_CHECK((*world)->size() < 0, "deliberate failure of the abort probe");
  }
  if ((*world)->rank() == 0) {
    int value = 0;
    auto h = (*world)->irecv(&value, sizeof(value), 1, 0);
    PIPER_CHECK_OK(h.status());
    piper::Status s = (*world)->wait(*h, 60.0);
    std::printf("abort probe: rank 0 was not aborted: %s\n", s.to_string().c_str());
  }
  return 1;
}
