#!/usr/bin/env python3
"""Peak memory of every rank, measured against the simulator and the closed form, over issue 27's strategies on 4
local ranks (docs/calibration.md "Memory, rank by rank"). Memory does not depend on the machine's load, so this
table is valid on a busy machine too. For an expert-parallel run the second prediction is the one with the run's
own measured expert loads (`predicted_vs_measured_own_expert_loads`: sim prices each ep rank from its own share,
the closed form every rank as the busiest).
Usage (from the repository root, after `. scripts/env.sh`):
  scripts/memory-table.py PIPER [MODEL [GLOBAL_BATCH [SEQ [STEPS]]]]      default tiny-moe 16 128 3"""
import sys

from issue27_runs import STRATEGIES, train



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
        j = train(piper, model, s, steps, batch, seq)
        if isinstance(j, str):
            print("| %s | failed: %s |" % (s, j))
            continue
        tables = [("calibration's loads", j["predicted_vs_measured"])]
        if "predicted_vs_measured_own_expert_loads" in j:
            tables.append(("the run's own loads", j["predicted_vs_measured_own_expert_loads"]))
        for label, t in tables:
            r = ratios(t)
            if len(tables) == 1 or label != tables[0][0]:
                worst[0] = max(worst[0], max(abs(x[1] - 1) for x in r) + 1)
                # The closed form prices every rank as the busiest under measured loads: its own rank only.
                closed = [max(r)] if len(tables) > 1 else r
                worst[1] = max(worst[1], max(abs(x[2] - 1) for x in closed) + 1)
            print("| %s | %s | %s | %s | %s |" % (s, label, " ".join("%.1f" % (x[0] / 2**20) for x in r),
                                                 " ".join("%.2f" % x[1] for x in r), " ".join("%.2f" % x[2] for x in r)),
                  flush=True)
    print("largest departure from 1 (each ep run with its own loads; the closed form at its busiest rank): "
          "simulated %.2f, closed form %.2f" %
          (worst[0] - 1, worst[1] - 1))


if __name__ == "__main__":
    main()
