// Loading a ClusterSpec from a preset name or a JSON file in our schema (docs/cluster_schema.md).
//
// load_cluster("h800", 16) reads the compiled-in preset and sets num_nodes; anything containing '/' or ending
// in ".json" is a file. num_nodes must be in 1..max_nodes (max_nodes 0 = unbounded); errors say so.
#pragma once

#include <string>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/spec/cluster_spec.h"

namespace piper {

Result<ClusterSpec> load_cluster(const std::string& name_or_path, int num_nodes);

// Parses one cluster object (num_nodes is not part of it) and validates it with the given node count.
Result<ClusterSpec> cluster_from_json(const Json& json, int num_nodes, const std::string& what);

// Every field in a fixed order; round-trips through cluster_from_json (num_nodes is not part of it).
OrderedJson to_json(const ClusterSpec& cluster);

}  // namespace piper
