#include "piper/cost/nic_split.h"

namespace piper::cost {
namespace {

std::string ports_text(const Strategy& s) {
  return "attn_ports=" + std::to_string(s.attn_ports) + ", ffn_ports=" + std::to_string(s.ffn_ports);
}

// Which group uses each NIC: 0 none, 1 attention, 2 FFN, 3 both.
std::vector<int> nic_users(const Strategy& s, const ClusterSpec& c) {
  const int g = c.node.devices_per_node, nics = static_cast<int>(c.node.nics.size());
  std::vector<int> users(static_cast<size_t>(c.num_nodes) * nics, 0);
  for (int d = 0; d < s.world_size() && d < c.world_size(); ++d) {
    const int nic = (d / g) * nics + c.node.nic_of_device(d % g);
    users[static_cast<size_t>(nic)] |= d < s.attn_ranks ? 1 : 2;
  }
  return users;
}

}  // namespace

Result<NicSplit> nic_split(const Strategy& s, const ClusterSpec& c) {
  NicSplit out;
  if (!s.disaggregate || (s.attn_ports == 0 && s.ffn_ports == 0)) return out;
  const std::string what = "strategy " + ports_text(s) + ": ";
  if (c.num_nodes <= 1) {
    out.natural_attn = s.attn_ranks;
    out.natural_ffn = s.ffn_ranks;
    if (s.attn_ports == s.attn_ranks && s.ffn_ports == s.ffn_ranks) return out;
    return invalid_argument(what + "on one node the groups exchange over the devices' own links, one port per GPU, "
                            "so the split must be attn_ports=" + std::to_string(s.attn_ranks) + ", ffn_ports=" +
                            std::to_string(s.ffn_ranks) + "; set those or drop attn_ports and ffn_ports");
  }
  const int nics = static_cast<int>(c.node.nics.size());
  const int total = nics * c.num_nodes;
  if (nics == 0) return invalid_argument(what + "cluster " + c.name + " has no NICs to split; drop the ports");
  if (s.attn_ports + s.ffn_ports > total) {
    return invalid_argument(what + "the split uses " + std::to_string(s.attn_ports + s.ffn_ports) +
                            " ports but cluster " + c.name + " has " + std::to_string(total) + " NICs (" +
                            std::to_string(c.num_nodes) + " nodes x " + std::to_string(nics) + "); lower them");
  }
  const std::vector<int> users = nic_users(s, c);
  for (size_t i = 0; i < users.size(); ++i) {
    if (users[i] == 3) {
      return invalid_argument(what + "NIC " + std::to_string(i % nics) + " of node " + std::to_string(i / nics) +
                              " serves devices of both groups, so its bandwidth cannot be split between them; "
                              "make attn_ranks end on a NIC boundary or drop the ports");
    }
    if (users[i] == 1) ++out.natural_attn;
    if (users[i] == 2) ++out.natural_ffn;
  }
  if (out.natural_attn == 0 || out.natural_ffn == 0) {
    return invalid_argument(what + "a group uses no NIC (all of its devices on nodes without one); drop the ports");
  }
  out.active = true;
  out.attn_scale = static_cast<double>(s.attn_ports) / out.natural_attn;
  out.ffn_scale = static_cast<double>(s.ffn_ports) / out.natural_ffn;
  out.nic_scale.assign(users.size(), 1.0);
  for (size_t i = 0; i < users.size(); ++i) {
    if (users[i] == 1) out.nic_scale[i] = out.attn_scale;
    if (users[i] == 2) out.nic_scale[i] = out.ffn_scale;
  }
  return out;
}

}  // namespace piper::cost
