// piper info --model NAME|FILE [--seq L] [--cluster NAME|FILE [--nodes N]] [--json]
// Parameters by part (total and active), training FLOPs per token, and/or the cluster description.
#include <algorithm>
#include <cstdio>

#include "piper/base/json.h"
#include "piper/base/units.h"
#include "piper/cli/command.h"
#include "piper/cli/flags.h"
#include "piper/cli/precision_flags.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/counting.h"
#include "piper/spec/model_json.h"
#include "piper/spec/model_loader.h"

namespace piper::cli {
namespace {

struct InfoOptions {
  std::string model;
  std::string cluster;
  int64_t seq_len = 0;  // 0: not given (min(4096, max_seq_len))
  int nodes = 1;
  int domain_nodes = 0;  // 0: not given (the whole scale-up domain)
  bool json = false;
};

std::string describe(const ModelSpec& m) {
  std::string s = std::to_string(m.num_layers) + " layers, hidden " + std::to_string(m.hidden_size) + ", ";
  if (m.attention == AttentionType::kMLA) {
    s += "MLA " + std::to_string(m.num_heads) + " heads";
  } else {
    s += std::to_string(m.num_heads) + "/" + std::to_string(m.num_kv_heads) + " heads of " + std::to_string(m.head_dim);
  }
  if (m.is_moe()) {
    s += ", MoE " + std::to_string(m.moe.num_experts) + " experts top-" + std::to_string(m.moe.top_k);
    if (m.moe.num_shared_experts > 0) s += " + " + std::to_string(m.moe.num_shared_experts) + " shared";
    s += " in " + std::to_string(m.num_moe_layers()) + " layers";
  } else {
    s += std::string(", dense ") + to_string(m.mlp) + " MLP " + std::to_string(m.intermediate_size);
  }
  return s + ", vocab " + std::to_string(m.vocab_size);
}

OrderedJson model_info_json(const ModelSpec& m, int64_t seq) {
  ParamCounts c = count_params(m);
  OrderedJson parts;
  for (const auto& [name, p] : c.parts()) parts[name] = {{"total", p.total}, {"active", p.active}};
  OrderedJson j;
  j["model"] = to_json(m);
  j["seq_len"] = seq;
  j["params_total"] = c.total();
  j["params_active"] = c.active();
  j["params_active_no_embedding"] = c.active_no_embedding();
  j["flops_per_token"] = training_flops_per_token(m, seq);
  j["forward_flops_per_token"] = forward_flops_per_token(m, seq);
  j["num_moe_layers"] = m.num_moe_layers();
  j["num_dense_layers"] = m.num_dense_layers();
  j["parts"] = parts;
  return j;
}

void print_model(const ModelSpec& m, int64_t seq) {
  ParamCounts c = count_params(m);
  std::printf("model %s: %s\n", m.name.c_str(), describe(m).c_str());
  if (!m.source.empty()) std::printf("source: %s\n", m.source.c_str());
  std::printf("\n%-16s %14s %14s\n", "part", "params total", "params active");
  for (const auto& [name, p] : c.parts()) {
    std::printf("%-16s %14s %14s\n", name.c_str(), format_count(static_cast<double>(p.total)).c_str(),
                format_count(static_cast<double>(p.active)).c_str());
  }
  std::printf("%-16s %14s %14s\n", "total", format_count(static_cast<double>(c.total())).c_str(),
              format_count(static_cast<double>(c.active())).c_str());
  std::printf("%-16s %14s %14s\n", "total w/o embed", "",
              format_count(static_cast<double>(c.active_no_embedding())).c_str());
  double train = training_flops_per_token(m, seq);
  std::printf("\ntraining FLOPs per token at seq %lld: %s (3 x forward, causal attention; 6 x active w/o embed = %s)\n",
              static_cast<long long>(seq), format_si(train, "FLOP").c_str(),
              format_si(6.0 * static_cast<double>(c.active_no_embedding()), "FLOP").c_str());
}

std::string bw(double bytes_per_s) { return format_si(bytes_per_s, "B/s"); }

void print_cluster(const ClusterSpec& c) {
  const DeviceSpec& d = c.device;
  std::printf("cluster %s: %d node(s) x %d devices = %d devices%s\n", c.name.c_str(), c.num_nodes,
              c.node.devices_per_node, c.world_size(),
              c.max_nodes > 0 ? (" (at most " + std::to_string(c.max_nodes) + " nodes)").c_str() : "");
  std::printf("device   %s: %s bf16, %s fp32, %s fp8; %s at %s\n", d.name.c_str(),
              format_si(d.peak_flops_bf16, "FLOP/s").c_str(), format_si(d.peak_flops_fp32, "FLOP/s").c_str(),
              d.peak_flops_fp8 > 0 ? format_si(d.peak_flops_fp8, "FLOP/s").c_str() : "no",
              format_bytes(static_cast<double>(d.memory_bytes)).c_str(), bw(d.memory_bw_bytes_per_s).c_str());
  const NodeSpec& n = c.node;
  if (n.pair_bw_bytes_per_s.empty()) {
    std::printf("intra    %s per direction between any two devices, latency %s\n", bw(n.intra.bw_bytes_per_s).c_str(),
                format_seconds(n.intra.latency_s).c_str());
  } else {
    std::printf("intra    per-pair bandwidth (per direction), latency %s:\n",
                format_seconds(n.intra.latency_s).c_str());
    for (int a = 0; a < n.devices_per_node; ++a) {
      std::printf("         ");
      for (int b = 0; b < n.devices_per_node; ++b) {
        std::printf(" %6.0f", a == b ? 0.0 : n.pair_bw(a, b) / 1e9);
      }
      std::printf("  GB/s\n");
    }
  }
  if (n.nics.empty()) {
    std::printf("NICs     none (single node)\n");
  } else {
    std::printf("NICs     %zu per node, %s in total, latency %s\n", n.nics.size(), bw(n.nic_bw_total()).c_str(),
                format_seconds(n.nic_latency_s).c_str());
    for (size_t i = 0; i < n.nics.size(); ++i) {
      std::string near;
      for (int dev : n.nics[i].near_devices) near += (near.empty() ? "" : ",") + std::to_string(dev);
      std::printf("         nic %zu: %s near devices {%s}\n", i, bw(n.nics[i].bw_bytes_per_s).c_str(), near.c_str());
    }
  }
  const ScaleUpSpec& u = c.scale_up;
  if (u.nodes_per_domain > 1) {
    const int dn = u.domain_nodes(), last = c.num_nodes - (c.num_domains() - 1) * dn;
    std::printf(
        "domain   %s: %d nodes x %d = %d devices per scale-up domain, reached through the node link (%s per "
        "direction), not the NICs\n",
        u.name.empty() ? "scale-up" : u.name.c_str(), u.nodes_per_domain, n.devices_per_node,
        u.nodes_per_domain * n.devices_per_node, bw(n.intra.bw_bytes_per_s).c_str());
    if (c.num_domains() == 1) {
      std::printf("         this job: %d node(s) = %d ranks, all in one domain\n", c.num_nodes, c.world_size());
    } else {
      std::printf("         this job: %d domains of %d node(s) = %d ranks each (--domain-nodes)", c.num_domains(), dn,
                  c.devices_per_domain());
      if (last != dn) std::printf(", the last with %d node(s)", last);
      std::printf("\n");
    }
  } else {
    std::printf("domain   each node is its own scale-up domain (%d devices)\n", n.devices_per_node);
  }
  const FabricSpec& f = c.fabric;
  std::printf("fabric   %s", to_string(f.topology));
  if (f.nodes_per_group > 0) std::printf(", %d nodes per group", f.nodes_per_group);
  std::printf(", intra-group taper %.2f, inter-group taper %.2f\n", f.intra_group_taper, f.inter_group_taper);
}

Status run_info(const InfoOptions& o) {
  if (o.model.empty() && o.cluster.empty()) {
    return invalid_argument("info: give --model NAME|FILE and/or --cluster NAME|FILE (see piper info --help)");
  }
  OrderedJson out;
  if (!o.model.empty()) {
    PIPER_ASSIGN_OR_RETURN(ModelSpec m, load_model(o.model));
    PIPER_ASSIGN_OR_RETURN(const int64_t seq, resolve_seq_len(m, o.seq_len));
    if (o.json) {
      out = model_info_json(m, seq);
    } else {
      print_model(m, seq);
    }
  }
  if (!o.cluster.empty()) {
    PIPER_ASSIGN_OR_RETURN(ClusterSpec c, load_cluster(o.cluster, o.nodes));
    PIPER_RETURN_IF_ERROR(apply_domain_nodes(o.domain_nodes, &c));
    if (o.json) {
      OrderedJson cj = to_json(c);
      cj["num_nodes"] = c.num_nodes;
      cj["world_size"] = c.world_size();
      cj["domain"] = {
          {"nodes", c.scale_up.domain_nodes()}, {"devices", c.devices_per_domain()}, {"num_domains", c.num_domains()}};
      out["cluster"] = cj;
    } else {
      if (!o.model.empty()) std::printf("\n");
      print_cluster(c);
    }
  }
  if (o.json) print_json(out.dump(2));
  return ok_status();
}

PIPER_REGISTER_COMMAND(g_info, "info", "Parameters, active parameters and FLOPs/token of a model; a cluster's hardware",
                       [](CLI::App* sub) {
                         auto o = std::make_shared<InfoOptions>();
                         sub->add_option("--model", o->model, "preset name or JSON file (ours or HF config.json)");
                         add_int_option(sub, "--seq", &o->seq_len, {1, kMaxSeqLen, "tokens per sequence"},
                                        "sequence length for FLOPs (default min(4096, max_seq_len))");
                         sub->add_option("--cluster", o->cluster, "cluster preset name or JSON file");
                         add_int_option(sub, "--nodes", &o->nodes, {1, kMaxNodes, "nodes of the cluster"},
                                        "number of nodes of the cluster")
                             ->capture_default_str();
                         add_domain_option(sub, &o->domain_nodes);
                         sub->add_flag("--json", o->json, "print one JSON object");
                         return std::function<Status()>([o] { return run_info(*o); });
                       });

}  // namespace
}  // namespace piper::cli
