// The one checking macro family for MPI calls (internal to comm/mpi). Every MPI call goes through it; a failure
// keeps the expression text and MPI's own error string:
//   PIPER_MPI_RETURN_IF_ERROR(MPI_Isend(...));  // in functions returning Status or Result<T>
//   PIPER_MPI_CHECK(MPI_Request_free(&r));       // where failure is a bug: prints and aborts the job
// Communicators use MPI_ERRORS_RETURN so that errors reach these macros instead of killing the process.
#pragma once

#include <mpi.h>

#include <string>

#include "piper/base/check.h"
#include "piper/base/status.h"

namespace piper::comm {

std::string mpi_error_string(int code);
Status mpi_error(int code, const char* expr, const char* file, int line);

}  // namespace piper::comm

#define PIPER_MPI_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                    \
    int piper_mpi_rc_ = (expr);                                                           \
    if (piper_mpi_rc_ != MPI_SUCCESS) [[unlikely]]                                        \
      return ::piper::comm::mpi_error(piper_mpi_rc_, #expr, __FILE__, __LINE__);          \
  } while (0)

#define PIPER_MPI_CHECK(expr)                                                                          \
  do {                                                                                                 \
    int piper_mpi_rc_ = (expr);                                                                        \
    PIPER_CHECK(piper_mpi_rc_ == MPI_SUCCESS, #expr, " -> ", ::piper::comm::mpi_error_string(piper_mpi_rc_)); \
  } while (0)
