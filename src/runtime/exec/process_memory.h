// The C library allocator's policy for a process that trains, or measures what training pays (`piper calibrate`,
// `piper bench comm`): keep freed memory for the next step instead of handing it back to the kernel.
//
// The runtime's tensors come from its MemoryPool, which keeps its blocks for reuse, but every step also allocates
// large temporaries outside it: Open MPI's nonblocking collectives (libnbc allocates and copies a temporary per
// call), the GEMM library's packing buffers, the handlers' exchange buffers. glibc serves blocks of 128 KiB and up
// (a threshold it raises to at most 32 MiB) with mmap and unmaps them when freed, trims a heap's free top and
// deletes thread heaps that empty, so each step faults those pages in again and the kernel zeroes them. Measured
// (docs/runtime.md "Freed memory stays with the process"; 4 ranks on 2 cores): 13,000 page faults a step on
// tiny-moe dp=2 tp=2, 170,000 on moe-40m dp=4 ZeRO-2; under this policy about none after the first step.
// The cost: the process keeps the largest heap it ever held (as a caching allocator does); the runtime's tracked
// memory, which the reports compare with the model, is unchanged.
// Call it first in the process, before MPI and the runtime start threads: the arena limit binds only arenas not
// yet created. Thread-safety: call once, from the main thread.
#pragma once

namespace piper::runtime {

// No mmap'ed blocks, no trimming, one arena. False when the C library is not glibc (nothing is changed) or
// refused a setting (a sanitizer's malloc refuses them all).
bool keep_freed_memory();

}  // namespace piper::runtime
