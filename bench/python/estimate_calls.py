#!/usr/bin/env python3
"""10,000 piper.estimate calls from Python against the same calls in C++ (issue 29's goal: at most 2x).

    PYTHONPATH=build/python python3 bench/python/estimate_calls.py [--calls 10000] [--baseline PATH]

The sweep is mixtral-8x7b on 8 dgx-h100 nodes (64 GPUs), seq 4096, over pp x ep x zero (32 strategies, repeated),
as examples/python/sweep_pp_ep.py does. Python: piper.estimate(model, cluster, strategy, seq=4096) with the model and
cluster loaded once, returning the result object. C++ (build/bench/python/python_estimate_baseline, run here in the
same session): the scenario, cost model, estimate and JSON object of each call, as python/bindings.cc builds them.
Prints both rates and the ratio Python / C++; the step times of both sides are summed and compared.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import piper


def strategies():
    out = []
    for pp in (1, 2, 4, 8):
        for ep in (1, 2, 4, 8):
            for zero in (0, 1):
                dp = 64 // pp
                out.append("dp=%d,pp=%d,ep=%d,microbatches=%d,schedule=1f1b,zero=%d" % (dp, pp, ep, 256 // dp, zero))
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_baseline = os.path.join(os.path.dirname(os.path.dirname(piper.__file__)), "..", "bench", "python",
                                    "python_estimate_baseline")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--baseline", default=os.path.normpath(default_baseline),
                    help="the C++ baseline executable (default: next to the build's python/ directory)")
    a = ap.parse_args()
    model = piper.Model.preset("mixtral-8x7b")
    cluster = piper.Cluster.preset("dgx-h100", nodes=8)
    ss = strategies()
    piper.estimate(model, cluster, ss[0], seq=4096)  # warm: imports, first-touch
    checksum = 0.0
    start = time.perf_counter()
    for i in range(a.calls):
        checksum += piper.estimate(model, cluster, ss[i % len(ss)], seq=4096).step_time_s
    py_s = time.perf_counter() - start
    out = subprocess.run([a.baseline, str(a.calls)] + ss, capture_output=True, text=True, check=True).stdout
    cpp = json.loads(out)
    print("calls       %d over %d strategies (mixtral-8x7b, 8 x dgx-h100, seq 4096)" % (a.calls, len(ss)))
    print("python      %.3f s  (%.1f us per call)" % (py_s, 1e6 * py_s / a.calls))
    print("c++         %.3f s  (%.1f us per call)" % (cpp["seconds"], 1e6 * cpp["seconds"] / a.calls))
    print("ratio       %.2f x  (python / c++; goal <= 2)" % (py_s / cpp["seconds"]))
    if abs(checksum - cpp["checksum"]) > 1e-9 * abs(checksum):
        print("step times DIFFER: python %.9g, c++ %.9g" % (checksum, cpp["checksum"]))
        return 1
    print("step times  equal (sum %.6g s)" % checksum)
    return 0


if __name__ == "__main__":
    sys.exit(main())
