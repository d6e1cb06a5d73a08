// A cluster file (`--cluster FILE`): parse_json + cluster_from_json (what load_cluster does with a path), with
// a node count taken from the input's length; a cluster that loads must round-trip through to_json.
#include <cstdint>

#include "fuzz_common.h"
#include "piper/base/json.h"
#include "piper/spec/cluster_loader.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<Json> j = parse_json(fuzz::as_text(data, size), "cluster.json");
  if (!j.ok()) return 0;
  const int num_nodes = static_cast<int>(size % 5);  // 0 (refused) .. 4
  Result<ClusterSpec> c = cluster_from_json(*j, num_nodes, "cluster.json");
  if (!c.ok()) return 0;
  const std::string written = to_json(*c).dump();
  Result<ClusterSpec> again = cluster_from_json(Json::parse(written), num_nodes, "written cluster");
  fuzz::require(again.ok(), "to_json() loads back", written + "\n" + (again.ok() ? "" : again.status().message()));
  fuzz::require(to_json(*again).dump() == written, "to_json() loads back the same", written);
  return 0;
}
