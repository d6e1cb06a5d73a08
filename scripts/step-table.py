#!/usr/bin/env python3
"""Step time, measured against the simulator and the closed form, over issue 27's strategies on 4 local ranks
(docs/calibration.md): rank 0's measured mean step (after the first), the simulated and closed-form steps and their
ratios, and for the expert-parallel rows also the simulation with the run's own measured expert loads (the report's
predicted_vs_measured_own_expert_loads); then the median ratios, how many lie in issue 27's bands (0.85-1.15
simulated, 0.8-1.2 closed form), Kendall tau between the simulated and the measured order, and the rank of the measured
fastest in the simulated order, once with the balanced experts' simulation and once with the ep rows' own loads.
Each row also splits its ratio in two (on CPU ranks sharing cores): `cpu x`, the measured CPU of all ranks per step
(user + system) over the simulated (the core-seconds its tasks and transfers held), and `cores busy`, that CPU over
the node's cores times the step, measured / simulated: measured / simulated step = cpu x * simulated busy / measured
busy. A row whose CPU is right but whose cores idle more than simulated is off by waiting, not by prices.
Timing is only evidence on a quiet machine: each row prints the 1-minute load average before its first run.
With RUNS > 1 every strategy is trained RUNS times, in rounds (each round trains every strategy once, so that a
drift of the machine spreads over all rows), and a row gives the median measured step and the runs' range.
Usage (from the repository root, after `. scripts/env.sh`; PIPER_CALIBRATION / PIPER_COMM_CALIBRATION as wanted):
  scripts/step-table.py PIPER [MODEL [STEPS [GLOBAL_BATCH [SEQ [RUNS]]]]]      default tiny-moe 10 16 128 1"""
import os
import statistics
import sys
import time

from issue27_runs import STRATEGIES, train


def kendall_tau(a, b):
    """Kendall's tau-a of two equally long lists (pairs tied in either count as neither)."""
    n, s = len(a), 0
    for i in range(n):
        for j in range(i + 1, n):
            x, y = a[i] - a[j], b[i] - b[j]
            s += (x * y > 0) - (x * y < 0)
    return s / (n * (n - 1) / 2) if n > 1 else 1.0


def cpu_split(p):
    """(measured / simulated CPU of all ranks, measured cores busy, simulated cores busy) of one run's report."""
    ranks = p["ranks"]
    measured = sum(r["measured"]["cpu_s"] for r in ranks)
    simulated = sum(r["simulated"].get("cpu_s", 0) for r in ranks)
    cores = p["cores"] * p.get("nodes", 1)
    if simulated <= 0 or cores <= 0:
        return None
    return (measured / simulated, measured / (cores * ranks[0]["measured"]["step_time_s"]),
            simulated / (cores * p["simulated_step_time_s"]))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    piper = sys.argv[1]
    model, steps, batch, seq, runs = (sys.argv[2:] + ["tiny-moe", "10", "16", "128", "1"][len(sys.argv) - 2:])[:5]
    if not runs.isdigit() or int(runs) < 1:
        sys.exit("step-table.py: RUNS must be a whole number of runs >= 1, got '%s'\n%s" % (runs, __doc__))
    runs = int(runs)
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), model, steps, "steps,", runs, "run(s) each; load",
          os.getloadavg())
    measured, loads, predicted, failed, split = {}, {}, {}, {}, {}
    for _ in range(runs):
        for s in STRATEGIES:
            if s in failed:
                continue
            loads.setdefault(s, os.getloadavg()[0])
            j = train(piper, model, s, steps, batch, seq)
            if isinstance(j, str):
                failed[s] = j
                continue
            p = j["predicted_vs_measured"]
            measured.setdefault(s, []).append(p["ranks"][0]["measured"]["step_time_s"])
            if cpu_split(p):
                split.setdefault(s, []).append(cpu_split(p))
            # An expert-parallel run is also predicted with its own measured loads (known after the run); the
            # last run's figures stand (its loads differ from the other runs' only by the router's timing).
            own = j.get("predicted_vs_measured_own_expert_loads")
            predicted[s] = (p["simulated_step_time_s"], p["resource_model_step_time_s"],
                            own["simulated_step_time_s"] if own else None)
    print("| strategy | measured%s | simulated | x | closed form | x | simulated, own loads | x | load | cpu x | "
          "cores busy (measured / simulated) |" % (" (range)" if runs > 1 else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for s in STRATEGIES:
        if s in failed:
            print("| %s | failed: %s |" % (s, failed[s]), flush=True)
            continue
        m, (sim, cf, own) = statistics.median(measured[s]), predicted[s]
        spread = " (%.0f-%.0f)" % (1e3 * min(measured[s]), 1e3 * max(measured[s])) if runs > 1 else ""
        rows.append((s, m, sim, cf, own or sim))
        own_cells = "%.0f ms | %.2f" % (1e3 * own, m / own) if own else "- | -"
        cells = "- | -"
        if split.get(s):
            cpu_x, busy, sim_busy = (statistics.median(v) for v in zip(*split[s]))
            cells = "%.2f | %.0f%% / %.0f%%" % (cpu_x, 100 * busy, 100 * sim_busy)
        print("| %s | %.0f ms%s | %.0f ms | %.2f | %.0f ms | %.2f | %s | %.1f | %s |" %
              (s, 1e3 * m, spread, 1e3 * sim, m / sim, 1e3 * cf, m / cf, own_cells, loads[s], cells), flush=True)
    if len(rows) < 2:
        return
    measured = [m for _, m, _, _, _ in rows]
    fastest = min(range(len(rows)), key=lambda i: measured[i])
    xc = [m / cf for _, m, _, cf, _ in rows]
    for label, col in (("simulated", 2), ("simulated, ep rows with their own loads", 4)):
        simulated = [r[col] for r in rows]
        xs = [m / sim for m, sim in zip(measured, simulated)]
        order = sorted(range(len(rows)), key=lambda i: simulated[i])
        print("%s: median measured / simulated %.2f (%d of %d in 0.85-1.15); Kendall tau (simulated vs measured "
              "order) %.2f; the measured fastest (%s) is #%d of the simulated order" %
              (label, statistics.median(xs), sum(0.85 <= x <= 1.15 for x in xs), len(xs),
               kendall_tau(simulated, measured), rows[fastest][0], order.index(fastest) + 1))
    print("closed form: median measured / closed form %.2f (%d in 0.8-1.2)" %
          (statistics.median(xc), sum(0.8 <= x <= 1.2 for x in xc)))
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load", os.getloadavg())


if __name__ == "__main__":
    main()
