#!/usr/bin/env python3
"""Compile time of the build flags before and after PIPER_FAST_TESTS and make's -g1 (docs/reliability.md, "CI's
time"): compiles every STEP-th translation unit of a build configured with the new flags twice, once with the old
flags (-O2 -g everywhere: -g1 back to -g, the tests' -O1 dropped) and once as configured, and prints the CPU seconds
(user + system of the compiler) of each, per folder and in total.

Usage: scripts/compile-flags-sample.py BUILD_DIR [STEP]   (BUILD_DIR configured with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
"""
import json
import os
import resource
import shlex
import subprocess
import sys


def cpu_seconds(args, cwd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(args, cwd=cwd, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    build = os.path.abspath(sys.argv[1])
    step = int(sys.argv[2]) if len(sys.argv) == 3 else 8
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/"
    units = json.load(open(os.path.join(build, "compile_commands.json")))
    units = sorted((u for u in units if u["file"].startswith(root) and u["file"].endswith(".cc")
                    and "/python/" not in u["file"]), key=lambda u: u["file"])
    totals = {}
    for unit in units[::step]:
        new = shlex.split(unit["command"])
        new[new.index("-o") + 1] = os.devnull
        old = ["-g" if a == "-g1" else a for a in new if a != "-O1"]
        rel = unit["file"][len(root):]
        t_old, t_new = cpu_seconds(old, unit["directory"]), cpu_seconds(new, unit["directory"])
        print(f"{rel} old {t_old:.1f} s new {t_new:.1f} s", flush=True)
        for key in (rel.split("/")[0], "all"):
            o, n, c = totals.get(key, (0.0, 0.0, 0))
            totals[key] = (o + t_old, n + t_new, c + 1)
    for key, (o, n, c) in totals.items():
        print(f"{key}: {c} units, old {o:.0f} s, new {n:.0f} s, ratio {n / o:.2f}")


if __name__ == "__main__":
    main()
