#!/usr/bin/env python3
"""Disaggregation: the AF-Pipe roofline/MILP step (`piper plan --disaggregate`, src/planner/af_model.cc) against the
simulated step of the very plan it picks (`piper simulate`), term by term, with the compiled plan itself
(`piper compile --emit-plan`) as the arbiter: which parts each side computes and how many bytes an attention GPU
sends to and receives from the FFN side per step. Issue 30 asks for agreement within 15 % or this explanation.
"""
import collections
import json
import os
import tempfile

import common

CASES = [("deepseek-moe-16b", 4096), ("qwen3-30b-a3b", 4096), ("qwen3-30b-a3b", 16384)]
NODES, BATCH = 16, 1024


def plan_traffic(model, seq, strategy):
    """Per side (attention = program 0, FFN = program 1): the compute parts, and rank 0's m2n bytes by role."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "plan.json")
        common.piper("compile", "--model", model, "--seq", seq, "--global-batch", BATCH, "--strategy", strategy,
                     "--emit-plan", path)
        with open(path) as f:
            plan = json.load(f)
    sides = []
    for index, program in enumerate(plan["programs"]):
        parts, sent, received = collections.Counter(), collections.Counter(), collections.Counter()
        for stream in program["streams"]:
            for ins in stream["instructions"]:
                if ins.get("op") == "compute":
                    parts[ins.get("part")] += ins.get("flops", 0)
                elif ins.get("comm") == "m2n" and ins.get("op") == "send":
                    sent[ins.get("role")] += ins.get("comm_bytes", 0)
                elif ins.get("comm") == "m2n" and ins.get("op") == "recv":
                    received[ins.get("role")] += ins.get("comm_bytes", 0)
        sides.append({"pp_rank": program.get("pp_rank", index), "parts": sorted(p for p in parts if p),
                      "sent": sum(sent.values()),
                      "received": sum(received.values()), "sent_by_role": dict(sent)})
    # The first attention stage and the first FFN stage (the one computing experts).
    ffn = next(side for side in sides if "experts" in side["parts"])
    return sides[0], ffn


def case(model, seq):
    j = common.piper("plan", "--model", model, "--cluster", "h800", "--nodes", NODES, "--seq", seq, "--global-batch",
                     BATCH, "--disaggregate")
    best, port_bw = j["best"], j["ports"]["bw_bytes_per_s"]
    terms = best["per_step"]
    sim = common.piper("simulate", "--model", model, "--cluster", "h800", "--nodes", NODES, "--seq", seq,
                       "--global-batch", BATCH, "--strategy", best["strategy"])
    closed = common.piper("estimate", "--model", model, "--cluster", "h800", "--nodes", NODES, "--seq", seq,
                          "--global-batch", BATCH, "--strategy", best["strategy"])
    attn, ffn = plan_traffic(model, seq, best["strategy"])
    attn_rank = next(r for r in sim["ranks"] if r["pp_rank"] == attn["pp_rank"])
    ffn_rank = next(r for r in sim["ranks"] if r["pp_rank"] == ffn["pp_rank"])
    # The roofline's bytes per attention GPU and direction: attn_network_s = step_bytes / (attn ports x port bw).
    roof_bytes = terms["attn_network_s"] * best["attn_ports"] * port_bw / best["attn_gpus"]
    return {
        "model": model, "seq": seq, "allocation": "%d:%d" % (best["attn_gpus"], best["ffn_gpus"]),
        "roof_step_s": best["step_time_s"], "sim_step_s": sim["step_time_s"],
        "closed_step_s": closed["step_time_s"],
        "roof_attn_compute_s": terms["attn_compute_s"], "sim_attn_busy_s": attn_rank["busy_s"],
        "roof_ffn_compute_s": terms["ffn_compute_s"], "sim_ffn_busy_s": ffn_rank["busy_s"],
        "roof_net_s": max(terms["attn_network_s"], terms["ffn_network_s"]), "sim_attn_comm_s": attn_rank["comm_s"],
        "sim_attn_exposed_s": attn_rank["exposed_comm_s"],
        "roof_bytes_per_dir_gb": roof_bytes / 1e9, "plan_a2f_gb": attn["sent"] / 1e9,
        "plan_f2a_gb": attn["received"] / 1e9, "plan_a2f_by_role": attn["sent_by_role"],
        "attn_parts": "+".join(attn["parts"]), "ffn_parts": "+".join(ffn["parts"]),
    }


def main():
    rows = [case(m, s) for m, s in CASES]
    for r in rows:
        r["step_ratio"] = common.ratio(r["sim_step_s"], r["roof_step_s"])
        r["closed_ratio"] = common.ratio(r["closed_step_s"], r["sim_step_s"])
        r["a2f_ratio"] = common.ratio(r["plan_a2f_gb"], r["roof_bytes_per_dir_gb"])
        r["ffn_ratio"] = common.ratio(r["sim_ffn_busy_s"], r["roof_ffn_compute_s"])
        r["attn_ratio"] = common.ratio(r["sim_attn_busy_s"], r["roof_attn_compute_s"])
    columns = [("model", "model"), ("seq", "seq"), ("allocation", "A:F"), ("roof_step_s", "roofline step s"),
               ("sim_step_s", "simulated step s"), ("step_ratio", "sim / roofline"),
               ("closed_step_s", "closed form step s"), ("closed_ratio", "closed form / sim"),
               ("roof_attn_compute_s", "A compute, roofline s"), ("sim_attn_busy_s", "A busy, sim s"),
               ("roof_ffn_compute_s", "F compute, roofline s"), ("sim_ffn_busy_s", "F busy, sim s"),
               ("roof_bytes_per_dir_gb", "A->F GB per A GPU, roofline"), ("plan_a2f_gb", "A->F GB, plan"),
               ("plan_f2a_gb", "F->A GB, plan"), ("roof_net_s", "network, roofline s"),
               ("sim_attn_comm_s", "A comm in flight, sim s"), ("attn_parts", "parts on A (plan)"),
               ("ffn_parts", "parts on F (plan)")]
    notes = [
        "Term by term (which one is wrong, and why):",
        "- **Placement.** The roofline (af_model.cc) prices the shared experts, the dense MLP layers and the LM head on",
        "  the attention side, as DisagMoE places dense parameters; the compiler's af-pipe lowering puts them on the",
        "  FFN side when pp = 1 (`parts on F`, deepseek-moe-16b: shared experts, its dense first layer and the head).",
        "  The FFN side's simulated busy time is therefore well above its roofline compute there (`F busy` against",
        "  `F compute`). The roofline follows the design; the compiled plan deviates, and it is what the simulator",
        "  and the runtime execute. Where nothing moves (qwen3-30b-a3b), F busy is still 1.3x the roofline's compute;",
        "  that gap is not pinned down yet (how each prices the experts' GEMM efficiency is the first suspect).",
        "- **Traffic.** The roofline counts, per token and MoE layer, d copies to the distinct FFN ranks plus one",
        "  combine gradient per direction (F-side combining). The plan sends from the attention side the forward",
        "  dispatch (d copies), the backward combine gradient to each of the d expert ranks (d copies, not 1), and",
        "  the shared-expert / dense-MLP input and its gradient (1 + 1 when there are any): 2d (+ 2) copies A->F",
        "  against 2 F->A (`A->F GB, plan` against `F->A GB, plan`). The A->F direction is the bottleneck and",
        "  carries up to twice the roofline's bytes (`plan_a2f_by_role` in the JSON).",
        "- **Overlap.** The roofline takes the step as max(compute, network) per side plus the fill; the simulator",
        "  finds part of the exchange exposed (`A comm in flight` is the time with an exchange outstanding).",
        "So the roofline/MILP ranks allocations with a model of a different plan (DisagMoE's placement, deduplicated",
        "gradients). `piper estimate` prices the compiled plan instead (session 21, cost/estimate_af.cc, docs/",
        "resource_model.md \"af-pipe\"): its placement, its m2n bytes (equal to the `plan` columns), compute against",
        "the NIC per rank, and the round trip of one microbatch through the chain (`closed form step`). It agrees with",
        "the simulator within 15 % on tests/sim/afpipe_closed_form_test.cc's nine rows and here on deepseek-moe-16b and",
        "qwen3 at 16K; qwen3 at 4K (pp=4, both sides network-bound) is 0.82: idle NIC time between dependent",
        "exchanges that the closed form does not model (docs/resource_model.md, \"af-pipe\"). Still not done: the",
        "allocator searching with that model, or the compiler adopting the roofline's placement and F-side gradient",
        "fan-out (the faster plan)."]
    common.write_table("af_model", "AF-Pipe: roofline/MILP against the simulated plan, term by term", columns, rows,
                       notes)


if __name__ == "__main__":
    main()
