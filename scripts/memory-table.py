#!/usr/bin/env python3
"""Peak memory of every rank, measured against the simulator and the closed form, over issue 27's strategies on 4
local ranks (docs/calibration.md "Memory, rank by rank"). Memory does not depend on the machine's load, so this
table is valid on a busy machine too. For an expert-parallel run the second prediction is the one with the run's
own measured expert loads (`predicted_vs_measured_own_expert_loads`: sim prices each ep rank from its own share,
the closed form every rank as the busiest).
Usage (from the repository root, after `. scripts/env.sh`):
  scripts/memory-table.py PIPER [MODEL [GLOBAL_BATCH [SEQ [STEPS]]]]      default tiny-moe 16 128 3"""
import json
import subprocess
import sys

STRATEGIES = [
    "dp=4,zero=1,microbatches=1,mbs=4",
    "dp=4,zero=2,microbatches=2,mbs=2",
    "dp=4,zero=3,microbatches=2,mbs=2",
    "pp=4,schedule=1f1b,microbatches=8,mbs=2",
    "dp=2,pp=2,schedule=1f1b,microbatches=4,mbs=2",
    "dp=2,pp=2,vpp=2,schedule=interleaved,microbatches=4,mbs=2",
    "dp=2,pp=2,schedule=zb-h1,microbatches=4,mbs=2",
    "dp=2,pp=2,schedule=dualpipev,microbatches=4,mbs=2",
    "dp=2,tp=2,sp=1,microbatches=2,mbs=4",
    "dp=4,ep=4,microbatches=1,mbs=4",
    "dp=4,ep=4,a2a=halo,microbatches=1,mbs=4",
    "dp=2,pp=2,ep=2,schedule=dualpipev,microbatches=4,mbs=2",
    "dp=2,ep=2,pp=1,schedule=af-pipe,disagg=1,attn_ranks=2,ffn_ranks=2,microbatches=8,mbs=1",
]


def ratios(report):
    out = []
    for r in report["ranks"]:
        m = r["measured"]["peak_memory_bytes"]
        out.append((m, m / r["simulated"]["peak_memory_bytes"], m / r["resource_model"]["peak_memory_bytes"]))
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    piper = sys.argv[1]
    model, batch, seq, steps = (sys.argv[2:] + ["tiny-moe", "16", "128", "3"][len(sys.argv) - 2:])[:4]
    print("| strategy | predicted with | measured MiB per rank | measured / simulated | measured / closed form |")
    print("|---|---|---|---|---|")
    worst = [1.0, 1.0]
    for s in STRATEGIES:
        cmd = [piper, "train", "--model", model, "--ranks", "4", "--steps", steps, "--global-batch", batch, "--seq",
               seq, "--strategy", s, "--json"] + (["--ranks-per-node", "2"] if "halo" in s else [])
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print("| %s | failed: %s |" % (s, (out.stdout + out.stderr).strip().splitlines()[-1]))
            continue
        j = json.loads(out.stdout)
        tables = [("calibration's loads", j["predicted_vs_measured"])]
        if "predicted_vs_measured_own_expert_loads" in j:
            tables.append(("the run's own loads", j["predicted_vs_measured_own_expert_loads"]))
        for label, t in tables:
            r = ratios(t)
            if len(tables) == 1 or label != tables[0][0]:
                for i in range(2):
                    worst[i] = max(worst[i], max(abs(x[i + 1] - 1) for x in r) + 1)
            print("| %s | %s | %s | %s | %s |" % (s, label, " ".join("%.1f" % (x[0] / 2**20) for x in r),
                                                 " ".join("%.2f" % x[1] for x in r), " ".join("%.2f" % x[2] for x in r)),
                  flush=True)
    print("largest departure from 1 (each ep run with its own loads): simulated %.2f, closed form %.2f" %
          (worst[0] - 1, worst[1] - 1))


if __name__ == "__main__":
    main()
