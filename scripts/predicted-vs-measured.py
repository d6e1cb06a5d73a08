#!/usr/bin/env python3
"""Measured vs predicted step time of two piper binaries on issue 27's five 4-rank strategies and one rank on 1 and 2
kernel threads (tiny-moe, 10 steps, global batch 16, seq 128): for each run it trains with BEFORE and then with
AFTER and prints a markdown row of rank 0's measured mean step (the mean of the two runs, and each), each binary's
simulated step and the ratio, the closed form and the 1-minute load average before each run (docs/calibration.md).
Usage (from the repository root, after `. scripts/env.sh`; set PIPER_CALIBRATION the same for both, or give BEFORE
its own file with PIPER_CALIBRATION_BEFORE: a binary from before session 25 refuses a file with the per-thread and
sharing keys, so it gets the same file without them; PIPER_COMM_CALIBRATION_BEFORE likewise gives BEFORE its own
link calibration, e.g. the same binary twice with and without a part of the link model):
  scripts/predicted-vs-measured.py BEFORE_PIPER AFTER_PIPER"""
import json
import os
import subprocess
import sys
import time

# (ranks, kernel threads or None for the default, strategy)
RUNS = [(1, 1, "microbatches=1,mbs=16"), (1, 2, "microbatches=1,mbs=16"),
        (4, None, "dp=4,zero=1,microbatches=1,mbs=4"), (4, None, "dp=2,pp=2,schedule=1f1b,microbatches=4,mbs=2"),
        (4, None, "pp=4,schedule=1f1b,microbatches=8,mbs=2"), (4, None, "dp=4,ep=4,microbatches=1,mbs=4"),
        (4, None, "dp=2,tp=2,sp=1,microbatches=2,mbs=4")]


def run(binary, ranks, threads, strategy, calibration=None, links=None):
    load = os.getloadavg()[0]
    env = dict(os.environ)
    if calibration:
        env["PIPER_CALIBRATION"] = calibration
    if links:
        env["PIPER_COMM_CALIBRATION"] = links
    cmd = [binary, "train", "--model", "tiny-moe", "--ranks", str(ranks), "--steps", "10", "--global-batch", "16",
           "--seq", "128", "--strategy", strategy, "--json"] + (["--threads", str(threads)] if threads else [])
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit("%s failed on %s: %s" % (binary, strategy, out.stdout + out.stderr))
    p = json.loads(out.stdout)["predicted_vs_measured"]
    return load, p["ranks"][0]["measured"]["step_time_s"], p["simulated_step_time_s"], p["resource_model_step_time_s"]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    before, after = sys.argv[1:]
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load", os.getloadavg())
    print("| strategy | measured (before / after run) | simulated before | x | simulated after | x | closed form | load |")
    print("|---|---|---|---|---|---|---|---|")
    for ranks, threads, s in RUNS:
        lb, mb, sb, cb = run(before, ranks, threads, s, os.environ.get("PIPER_CALIBRATION_BEFORE"),
                         os.environ.get("PIPER_COMM_CALIBRATION_BEFORE"))
        la, ma, sa, ca = run(after, ranks, threads, s)
        if abs(cb - ca) > 1e-9 * cb:
            print("(closed form differs: %.6f s before, %.6f s after)" % (cb, ca))
        m = (mb + ma) / 2
        label = s if ranks > 1 else "1 rank, %d thread%s" % (threads, "" if threads == 1 else "s")
        print("| %s | %.0f ms (%.0f / %.0f) | %.0f ms | %.2f | %.0f ms | %.2f | %.0f ms | %.1f / %.1f |" %
              (label, 1e3 * m, 1e3 * mb, 1e3 * ma, 1e3 * sb, m / sb, 1e3 * sa, m / sa, 1e3 * ca, lb, la),
              flush=True)
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load", os.getloadavg())


if __name__ == "__main__":
    main()
