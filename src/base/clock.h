// The machine's clocks as seconds: wall (monotonic, one clock for every process of the machine) and CPU time, of
// the whole process (every thread, user + system) or of the calling thread. Measurements of this machine
// (`piper calibrate`, the link calibration, `piper train`'s CPU per step) read them from here.
#pragma once

namespace piper {

double wall_s();         // CLOCK_MONOTONIC
double process_cpu_s();  // CLOCK_PROCESS_CPUTIME_ID: every thread of this process, user + system
double thread_cpu_s();   // CLOCK_THREAD_CPUTIME_ID: the calling thread

}  // namespace piper
