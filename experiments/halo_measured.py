#!/usr/bin/env python3
"""MoE on HPC: HALO against MPI_Alltoallv measured on two emulated nodes (scripts/two-node-emulation.sh: network
namespaces joined by a veth pair shaped to 1 Gbit/s, 4 ranks per node), three runs of `piper bench comm`: the MoE
dispatch (top-4 of 16 experts, 512 tokens of 4 KiB per rank), its combine, and plain all-to-all at 64 KiB..1 MiB
per pair. Needs root (namespaces and tc); without it, or with the namespaces already in use, the script writes a
table that says so instead of numbers.
"""
import json
import os
import subprocess

import common

RUNS = 3


def bench_once():
    cmd = [os.path.join(common.ROOT, "scripts", "two-node-emulation.sh"), "--bin", common.PIPER, "--", "bench", "comm",
           "--ranks-per-node", "4", "--sizes", "64KiB,256KiB,1MiB", "--iterations", "5", "--tokens", "512",
           "--token-bytes", "4096", "--experts", "16", "--top-k", "4", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        raise common.PiperError("two-node-emulation.sh: exit %d: %s" % (p.returncode, p.stderr.strip()[-400:]))
    text = p.stdout
    return json.loads(text[text.index("{"):])


def main():
    rows, why = [], None
    load_before = os.getloadavg()[0]
    if os.geteuid() != 0:
        why = "not run: needs root (network namespaces and tc)"
    else:
        try:
            for run in range(1, RUNS + 1):
                load = os.getloadavg()[0]
                j = bench_once()
                row = {"run": run, "load": load, "dispatch": j["moe_dispatch"]["halo_over_mpi"],
                       "combine": j["moe_combine"]["halo_over_mpi"],
                       "dispatch_internode_mib": j["moe_dispatch"]["halo_internode_bytes"] / 2**20,
                       "flat_internode_mib": j["moe_dispatch"]["flat_internode_bytes"] / 2**20}
                for a in j["all_to_all"]:
                    row["a2a_%dk" % (a["bytes_per_pair"] // 1024)] = a["halo_over_mpi"]
                rows.append(row)
        except (common.PiperError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
            why = "failed: %s" % e
    columns = [("run", "run"), ("load", "load avg (1 min) before"), ("dispatch", "MoE dispatch HALO/MPI"),
               ("combine", "MoE combine HALO/MPI"),
               ("flat_internode_mib", "flat inter-node MiB"), ("dispatch_internode_mib", "HALO inter-node MiB"),
               ("a2a_64k", "all-to-all 64 KiB"), ("a2a_256k", "256 KiB"), ("a2a_1024k", "1 MiB")]
    notes = ["HALO/MPI = MPI_Alltoallv time / HALO time (above 1: HALO faster), `piper bench comm` on two emulated nodes",
             "(1 Gbit/s, 4 ranks each). Issue 30 asks for >= 1.5 for the dispatch and the combine. This machine (2 cores) is",
             "shared with other builds; load average before the runs: %.1f -> after: %.1f (before each run: its row);" % (
                 load_before, os.getloadavg()[0]), "a loaded machine slows both sides."]
    if why:
        notes.insert(0, "**%s**" % why)
    common.write_table("halo_measured", "HALO against MPI_Alltoallv on two emulated nodes (measured)", columns, rows,
                       notes, extra={"status": why or "measured"})


if __name__ == "__main__":
    main()
