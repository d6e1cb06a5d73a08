#!/usr/bin/env python3
"""Step time, measured against the simulator and the closed form, over issue 27's strategies on 4 local ranks
(docs/calibration.md): rank 0's measured mean step (after the first), the simulated and closed-form steps and their
ratios; then the median ratios, how many lie in issue 27's bands (0.85-1.15 simulated, 0.8-1.2 closed form), Kendall
tau between the simulated and the measured order, and the rank of the measured fastest in the simulated order.
Timing is only evidence on a quiet machine: each row prints the 1-minute load average before its run.
Usage (from the repository root, after `. scripts/env.sh`; PIPER_CALIBRATION / PIPER_COMM_CALIBRATION as wanted):
  scripts/step-table.py PIPER [MODEL [STEPS [GLOBAL_BATCH [SEQ]]]]      default tiny-moe 10 16 128"""
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


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    piper = sys.argv[1]
    model, steps, batch, seq = (sys.argv[2:] + ["tiny-moe", "10", "16", "128"][len(sys.argv) - 2:])[:4]
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), model, steps, "steps; load", os.getloadavg())
    print("| strategy | measured | simulated | x | closed form | x | load |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for s in STRATEGIES:
        load = os.getloadavg()[0]
        j = train(piper, model, s, steps, batch, seq)
        if isinstance(j, str):
            print("| %s | failed: %s |" % (s, j), flush=True)
            continue
        p = j["predicted_vs_measured"]
        m, sim, cf = p["ranks"][0]["measured"]["step_time_s"], p["simulated_step_time_s"], p["resource_model_step_time_s"]
        rows.append((s, m, sim, cf))
        print("| %s | %.0f ms | %.0f ms | %.2f | %.0f ms | %.2f | %.1f |" % (s, 1e3 * m, 1e3 * sim, m / sim, 1e3 * cf,
                                                                       m / cf, load), flush=True)
    if len(rows) < 2:
        return
    xs = [m / sim for _, m, sim, _ in rows]
    xc = [m / cf for _, m, _, cf in rows]
    measured = [m for _, m, _, _ in rows]
    simulated = [sim for _, _, sim, _ in rows]
    fastest = min(range(len(rows)), key=lambda i: measured[i])
    order = sorted(range(len(rows)), key=lambda i: simulated[i])
    print("median measured / simulated %.2f (%d of %d in 0.85-1.15), measured / closed form %.2f (%d in 0.8-1.2)" %
          (statistics.median(xs), sum(0.85 <= x <= 1.15 for x in xs), len(xs), statistics.median(xc),
           sum(0.8 <= x <= 1.2 for x in xc)))
    print("Kendall tau (simulated vs measured order) %.2f; the measured fastest (%s) is #%d of the simulated order" %
          (kendall_tau(simulated, measured), rows[fastest][0], order.index(fastest) + 1))
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load", os.getloadavg())


if __name__ == "__main__":
    main()
