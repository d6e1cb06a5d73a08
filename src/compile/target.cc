#include "piper/compile/target.h"

namespace piper::compile {

Target megatron_target() { return Target{"megatron", true, true}; }

Target cpu_runtime_target() { return Target{"cpu-runtime", true, true}; }

}  // namespace piper::compile
