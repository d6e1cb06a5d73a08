#!/usr/bin/env python3
"""Issue 27's two-node table: tiny-moe on two emulated nodes of four ranks (scripts/two-node-emulation.sh, 1 Gbit/s
between them), rank 0's measured step (median of RUNS, in rounds) against the simulation, the closed form and, for
the expert-parallel rows, the simulation with the run's own expert loads; peak memory measured / simulated, the
smallest and largest over the ranks and runs; then the medians and how many rows lie in issue 27's band (0.8-1.2).
Needs root (network namespaces) and a cross-host link calibration, made under the same emulation:
  scripts/two-node-emulation.sh -- calibrate --ranks 8 --links-out LINKS
Usage (from the repository root, after `. scripts/env.sh`; PIPER_CALIBRATION=DEVICE_FILE
PIPER_COMM_CALIBRATION=LINKS):  scripts/two-node-table.py PIPER [RUNS]      default 2 runs"""
import json
import os
import statistics
import subprocess
import sys
import time

STRATEGIES = [
    "dp=8,zero=1,microbatches=1,mbs=2", "dp=8,zero=2,microbatches=1,mbs=2", "dp=8,zero=3,microbatches=1,mbs=2",
    "dp=4,pp=2,schedule=1f1b,microbatches=4,mbs=1", "dp=4,pp=2,schedule=zb-h1,microbatches=4,mbs=1",
    "dp=4,pp=2,vpp=2,schedule=interleaved,microbatches=4,mbs=1", "dp=4,pp=2,schedule=dualpipev,microbatches=4,mbs=1",
    "dp=2,pp=4,schedule=1f1b,microbatches=8,mbs=1", "dp=4,tp=2,sp=1,microbatches=1,mbs=4",
    "dp=8,ep=8,microbatches=1,mbs=2", "dp=8,ep=8,a2a=halo,microbatches=1,mbs=2",
    "dp=4,pp=2,ep=4,schedule=dualpipev,microbatches=4,mbs=1",
]


def train(piper, strategy):
    """One 8-step run under the emulation: the parsed report, or the error's last line as a string."""
    cmd = ["scripts/two-node-emulation.sh", "--bin", piper, "--", "train", "--model", "tiny-moe", "--steps", "8",
           "--global-batch", "16", "--seq", "128", "--strategy", strategy, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    try:
        return json.loads(out.stdout[out.stdout.index("{"):])
    except ValueError:
        return ((out.stdout + out.stderr).strip().splitlines() or ["exit %d" % out.returncode])[-1][:200]


def record(rows, strategy, report):
    p = report["predicted_vs_measured"]
    own = report.get("predicted_vs_measured_own_expert_loads")
    predicted = own or p
    row = rows.setdefault(strategy, {"measured": [], "memory": []})
    # The predictions of the last run stand (an ep run's own loads differ between runs only by the router's timing).
    row.update(sim=p["simulated_step_time_s"], closed=p["resource_model_step_time_s"],
               own=own["simulated_step_time_s"] if own else None)
    row["measured"].append(p["ranks"][0]["measured"]["step_time_s"])
    row["memory"] += [x["measured"]["peak_memory_bytes"] / predicted["ranks"][k]["simulated"]["peak_memory_bytes"]
                      for k, x in enumerate(p["ranks"])]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    runs = sys.argv[2] if len(sys.argv) > 2 else "2"
    if not runs.isdigit() or int(runs) < 1:
        sys.exit("two-node-table.py: RUNS must be a whole number of runs >= 1, got '%s'\n%s" % (runs, __doc__))
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load", os.getloadavg())
    rows, failed = {}, {}
    for _ in range(int(runs)):
        for s in STRATEGIES:
            if s in failed:
                continue
            report = train(sys.argv[1], s)
            if isinstance(report, str):
                failed[s] = report
            else:
                record(rows, s, report)
    print("| strategy | measured (range) | simulated | x | closed form | x | simulated, own loads | x | "
          "memory measured / simulated (ranks) |")
    print("|---|---|---|---|---|---|---|---|---|")
    sim_x, closed_x = [], []
    for s in STRATEGIES:
        if s in failed or s not in rows:
            print("| %s | failed: %s |" % (s, failed.get(s)))
            continue
        e = rows[s]
        m = statistics.median(e["measured"])
        sim_x.append(m / (e["own"] or e["sim"]))
        closed_x.append(m / e["closed"])
        own = "%.0f ms | %.2f" % (1e3 * e["own"], m / e["own"]) if e["own"] else "- | -"
        print("| %s | %.0f ms (%.0f-%.0f) | %.0f ms | %.2f | %.0f ms | %.2f | %s | %.2f-%.2f |" % (
            s, 1e3 * m, 1e3 * min(e["measured"]), 1e3 * max(e["measured"]), 1e3 * e["sim"], m / e["sim"],
            1e3 * e["closed"], m / e["closed"], own, min(e["memory"]), max(e["memory"])))
    if sim_x:
        print("median measured / simulated (ep rows with their own loads) %.2f, %d of %d in 0.8-1.2; closed form %.2f, "
              "%d in 0.8-1.2" % (statistics.median(sim_x), sum(0.8 <= x <= 1.2 for x in sim_x), len(sim_x),
                                 statistics.median(closed_x), sum(0.8 <= x <= 1.2 for x in closed_x)))
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load", os.getloadavg())


if __name__ == "__main__":
    main()
