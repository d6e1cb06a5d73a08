#!/usr/bin/env python3
"""MoE on HPC: weak scaling of a large MoE on Frontier from 64 to 1,024 GCDs (8 to 128 nodes), PP x EP with the
expert-parallel group kept inside a node (ep = 8 = one node's GCDs, the innermost mesh axis), and the all-to-all
algorithm: HALO against flat from 2 to 128 nodes, by the simulator and by the closed form.

Weak scaling: mixtral-8x22b (141B; 8 experts, so ep = 8 fills a node), pp = 8 (56 layers, 7 per stage), dp = GCDs /
8, 16 microbatches of one 4096-token sequence per data-parallel rank, ZeRO-1, full recomputation: the global batch
grows with the machine (128 sequences on 64 GCDs to 2,048 on 1,024). The design's own scaling figures are not
public (../shared/reference/moe_comm_and_balance.md 0: abstract only), so the table has no published column.

HALO against flat: deepseek-v3 (256 routed experts, top-8) with ep = min(8 x nodes, 256) spanning nodes (pp = 1 up
to 32 nodes, then pp = ranks / 256), the same strategy with a2a=flat and a2a=halo. The point is the all-to-all, not
memory: these plans do not all fit, and are compared anyway.
"""
import common

GCDS = [64, 128, 256, 512, 1024]
NODES = [2, 4, 8, 16, 32, 64, 128]


def weak_scaling():
    rows = []
    for gcds in GCDS:
        nodes = gcds // 8
        dp = gcds // 8
        strategy = "dp=%d,pp=8,ep=8,zero=1,recompute=full,schedule=1f1b,microbatches=16,mbs=1" % dp
        args = ("--model", "mixtral-8x22b", "--cluster", "frontier", "--nodes", nodes, "--seq", 4096,
                "--strategy", strategy)
        sim = common.try_piper("simulate", *args)
        est = common.try_piper("estimate", *args)
        rows.append({"gcds": gcds, "nodes": nodes, "global_batch": sim.get("global_batch"),
                     "sim_step_s": sim.get("step_time_s"), "sim_mfu": sim.get("mfu"),
                     "sim_exposed": sim.get("exposed_comm_fraction"), "fits": sim.get("fits"),
                     "est_step_s": est.get("step_time_s"), "est_mfu": est.get("mfu"),
                     "tflops_per_gcd": sim.get("mfu") and sim["mfu"] * 191.5, "strategy": strategy})
    return rows


def halo_vs_flat():
    rows = []
    for nodes in NODES:
        ranks = 8 * nodes
        ep = min(ranks, 256)
        pp = max(1, ranks // 256) if ranks > 256 else 1
        dp = ranks // pp
        strategy = "dp=%d,pp=%d,ep=%d,zero=1,recompute=full,schedule=1f1b,microbatches=%d,mbs=1" % (
            dp, pp, ep, max(2 * pp, 4))
        row = {"nodes": nodes, "ep": ep, "pp": pp}
        for algo in ("flat", "halo"):
            args = ("--model", "deepseek-v3", "--cluster", "frontier", "--nodes", nodes, "--seq", 4096,
                    "--strategy", strategy + ",a2a=" + algo)
            sim = common.try_piper("simulate", *args)
            est = common.try_piper("estimate", *args)
            row["sim_" + algo] = sim.get("step_time_s")
            row["est_" + algo] = est.get("step_time_s")
            row["est_ep_" + algo] = est.get("exposed_comm", {}).get("ep")
        row["sim_ratio"] = common.ratio(row["sim_flat"], row["sim_halo"])
        row["est_ratio"] = common.ratio(row["est_flat"], row["est_halo"])
        row["agree"] = (None if row["sim_ratio"] is None or row["est_ratio"] is None else
                        (row["sim_ratio"] > 1) == (row["est_ratio"] > 1))
        rows.append(row)
    return rows


def main():
    rows = weak_scaling()
    columns = [("gcds", "GCDs"), ("global_batch", "global batch"), ("sim_step_s", "simulated step s"),
               ("sim_mfu", "simulated MFU"), ("tflops_per_gcd", "TFLOP/s per GCD"), ("est_step_s", "closed form s"),
               ("est_mfu", "closed-form MFU"), ("sim_exposed", "exposed comm"), ("fits", "fits")]
    notes = ["mixtral-8x22b on Frontier (frontier preset: 8 GCDs per node, 191.5 TFLOP/s bf16 peak per GCD), pp=8,",
             "ep=8 inside a node, dp = GCDs/8, 16 microbatches, ZeRO-1, full recomputation, seq 4096. Ideal weak",
             "scaling keeps the step time and MFU constant. Published: not public (the design's abstract gives no",
             "scaling table; ../shared/reference/moe_comm_and_balance.md 0)."]
    common.write_table("hpc_weak_scaling", "Weak scaling of a large MoE on Frontier, 64 to 1,024 GCDs", columns,
                       rows, notes)
    common.plot("hpc_weak_scaling", "mixtral-8x22b on Frontier: weak scaling", "GCDs", "MFU",
                [("simulated", [r["gcds"] for r in rows], [r["sim_mfu"] for r in rows]),
                 ("closed form", [r["gcds"] for r in rows], [r["est_mfu"] for r in rows])], logx=True, xticks=GCDS)
    rows = halo_vs_flat()
    columns = [("nodes", "nodes"), ("ep", "ep"), ("pp", "pp"), ("sim_flat", "sim flat s"), ("sim_halo", "sim HALO s"),
               ("sim_ratio", "sim flat/HALO"), ("est_flat", "closed form flat s"), ("est_halo", "closed form HALO s"),
               ("est_ratio", "closed form flat/HALO"), ("agree", "agree on the faster")]
    notes = ["deepseek-v3 on Frontier, ep = min(8 x nodes, 256) over nodes, ZeRO-1, full recomputation, seq 4096;",
             "ratio above 1 means HALO is faster. Measured on two emulated nodes: `piper bench comm` under",
             "scripts/two-node-emulation.sh (docs/experiments.md)."]
    common.write_table("halo_vs_flat", "HALO against flat all-to-all, 2 to 128 Frontier nodes", columns, rows, notes)
    common.plot("halo_vs_flat", "deepseek-v3 on Frontier: step time flat / HALO", "nodes", "flat / HALO",
                [("simulator", [r["nodes"] for r in rows], [r["sim_ratio"] for r in rows]),
                 ("closed form", [r["nodes"] for r in rows], [r["est_ratio"] for r in rows])], logx=True,
                xticks=NODES)


if __name__ == "__main__":
    main()
