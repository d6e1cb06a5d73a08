#!/usr/bin/env python3
"""DualPipeV written in Python, registered as schedule "py-dualpipev", trained on 4 ranks against the built-in one.

    PYTHONPATH=build/python python3 examples/python/dualpipev.py [--steps 3] [--timeline-png F]

The function below is DeepSeek's DualPipeV ("cut-in-half" DualPipe, deepseek-ai/DualPipe dualpipev.py): rank r holds
stages r and 2p-1-r, and runs the eight phases of its step table, with overlapped forward/backward pairs as one
may-overlap slot and zero-bubble backwards split into B (input gradient) now and W (weight gradient) later. The
script checks that it emits the built-in schedule's directives for pp = 1..4, trains
dp=2,pp=2,ep=2,zero=1,microbatches=4 with both on 4 local MPI ranks, prints both loss curves, and exits 1 unless
they are equal. --timeline-png draws the simulated step of the Python schedule (piper.plot.timeline).
"""
import argparse
import collections
import os
import sys
import tempfile

import piper
import piper.plot


def dualpipev(p):
    """DualPipeV: V-shaped, two stages per rank, overlapped F&B pairs."""
    pp, m = p.pp, p.microbatches
    if m < 2 * pp:
        raise ValueError("dualpipev needs microbatches >= 2*pp (got m=%d, pp=%d)" % (m, pp))
    d = piper.Directives()
    for r in range(pp):
        d.place({"stage": r}, rank=r).place({"stage": 2 * pp - 1 - r}, rank=r)
    for r in range(pp):
        d.order(r, _rank_row(pp, m, r))
    return d


def _rank_row(pp, m, r):
    stage, nf, nb, wq, row = (r, 2 * pp - 1 - r), [0, 0], [0, 0], collections.deque(), []

    def f(ph):
        nf[ph] += 1
        return piper.action(stage[ph], "F", nf[ph] - 1)

    def b(ph, zb=False):  # fused BW, or (zero bubble) B now and its W queued
        nb[ph] += 1
        if zb:
            wq.append((stage[ph], nb[ph] - 1))
        return piper.action(stage[ph], "B" if zb else "BW", nb[ph] - 1)

    def w():  # the oldest queued weight gradient
        s, mb = wq.popleft()
        return piper.action(s, "W", mb)

    row += [f(0) for _ in range(2 * (pp - r - 1))]             # 1: nF0
    for _ in range(r + 1):                                      # 2: nF0F1
        row += [f(0), f(1)]
    for _ in range(pp - r - 1):                                 # 3: nB1W1F1 (zero bubble)
        row += [b(1, True), w(), f(1)]
    for i in range(m - 2 * pp + r + 1):                         # 4: nF0B1F1B0 (main)
        row += [f(0), b(1)] if i == 0 and r == pp - 1 else [[f(0), b(1)]]
        row.append([f(1), b(0)])
    for _ in range(pp - r - 1):                                 # 5: nB1F1B0
        row += [b(1), [f(1), b(0)]]
    zb = False                                                  # 6: nB1B0, the second half zero bubble
    for i in range(r + 1):
        zb = zb or (i == (r + 1) // 2 and r % 2 == 1)
        row.append(b(1, zb))
        zb = zb or (i == (r + 1) // 2 and r % 2 == 0)
        row.append(b(0, zb))
    for _ in range(pp - r - 1):                                 # 7: nWB0 (zero bubble)
        row += [w(), b(0, True)]
    return row + [w() for _ in range(r + 1)]                    # 8: nW


STRATEGY = "dp=2,pp=2,ep=2,zero=1,schedule=%s,microbatches=4,mbs=1"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeline-png", help="draw the simulated step of the Python schedule")
    args = ap.parse_args()
    piper.register_schedule("py-dualpipev", dualpipev, stages_per_rank=2)
    for pp in (1, 2, 3, 4):
        for m in (2 * pp, 2 * pp + 3):
            same = piper.schedule_directives("py-dualpipev", pp, m) == piper.schedule_directives("dualpipev", pp, m)
            print("directives pp=%d microbatches=%d: %s" % (pp, m, "equal" if same else "DIFFERENT"))
            if not same:
                return 1
    runs = {}
    for name in ("dualpipev", "py-dualpipev"):
        runs[name] = piper.train("tiny-moe", STRATEGY % name, ranks=4, steps=args.steps, seq=32)
        print("%-13s losses %s" % (name, " ".join("%.6f" % l for l in runs[name].losses)))
    if args.timeline_png:
        with tempfile.TemporaryDirectory() as tmp:
            sim = piper.simulate("tiny-moe", "local-cpu", "pp=2,schedule=py-dualpipev,microbatches=4", seq=32,
                                 trace=os.path.join(tmp, "step.json"))  # one dp slice: the V on 2 pipeline ranks
            piper.plot.timeline(sim, args.timeline_png)
        print("wrote %s" % args.timeline_png)
    equal = runs["dualpipev"].losses == runs["py-dualpipev"].losses
    print("losses %s" % ("equal, bit for bit" if equal else "DIFFER"))
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
