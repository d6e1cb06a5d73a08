#!/usr/bin/env python3
"""Programmable training: DualPipeV, 1F1B, interleaved and ZB-H1 on a ~1B and a ~9B dense model (Qwen3-1.7B and
Qwen3-8B, experiments/models/), and the largest global batch that fits under PP x ZeRO-3 against PP x ZeRO-1.

Setup, as the design's artifact runs it (../shared/reference/schedules.md 4.5 [confirmed]: m = 2 * pp, ZeRO-1 for
the comparison of schedules): one DGX H100 node (8 GPUs), pp = 4, dp = 2, 8 microbatches of one 4096-token
sequence. The published testbed is not public; the numbers below are the simulator's on the dgx-h100 preset.
The batch experiment raises the microbatch size (sequences per microbatch, m = 2 * pp fixed) to the largest whose
compiled plan still fits in a GPU's memory (`piper simulate`'s `fits`: the plan's peak against the device).
"""
import os

import common

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
CASES = [("qwen3-1.7b", "~1B"), ("qwen3-8b", "~9B")]
SCHEDULES = [("1f1b", ""), ("interleaved", ",vpp=2"), ("zb-h1", ""), ("dualpipev", "")]
# ../shared/reference/schedules.md 4.5 [secondary]: Qwen3-1B, DualPipeV +13 % over 1F1B; Qwen3-9B, DualPipeV
# +10 % over interleaved (and +6 % over Megatron's interleaved).
PUBLISHED = {"~1B": ("1f1b", 1.13), "~9B": ("interleaved", 1.10)}


def model_file(name):
    return os.path.join(MODELS, name + ".json")


def simulate(model, strategy, nodes=1, seq=4096):
    return common.try_piper("simulate", "--model", model_file(model), "--cluster", "dgx-h100", "--nodes", nodes,
                            "--seq", seq, "--strategy", strategy)


def schedule_rows():
    rows = []
    for model, size in CASES:
        row = {"model": model, "size": size}
        for name, extra in SCHEDULES:
            r = simulate(model, "dp=2,pp=4,zero=1,microbatches=8,mbs=1,schedule=" + name + extra)
            row[name + "_s"] = r.get("step_time_s")
            row[name + "_bubble"] = r.get("bubble_fraction")
            row[name + "_fits"] = r.get("fits")
        base, published = PUBLISHED[size]
        row["dualpipev_gain"] = common.ratio(row.get(base + "_s"), row.get("dualpipev_s"))
        row["gain_over"] = base
        row["published_gain"] = published
        rows.append(row)
    return rows


def largest_batch(model, zero, pp, dp):
    """The largest global batch (dp * 2pp * mbs, mbs up to 1024) whose plan fits, and its peak: mbs doubled until
    the plan does not fit, then bisected."""

    def fits(mbs):
        r = simulate(model, "dp=%d,pp=%d,zero=%d,schedule=1f1b,microbatches=%d,mbs=%d" % (dp, pp, zero, 2 * pp, mbs))
        return r if "error" not in r and r.get("fits") else None

    lo, lo_run, hi = 0, None, 1
    while hi <= 1024:
        r = fits(hi)
        if r is None:
            break
        lo, lo_run, hi = hi, r, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        r = fits(mid)
        if r is None:
            hi = mid
        else:
            lo, lo_run = mid, r
    if lo_run is None:
        return None
    return dp * 2 * pp * lo, lo_run["peak_memory_bytes"]["max"]


def batch_rows():
    rows = []
    for model, pp, dp in (("qwen3-8b", 2, 4), ("qwen3-8b", 4, 2), ("qwen3-8b", 8, 1), ("qwen3-1.7b", 4, 2)):
        row = {"model": model, "pp": pp, "dp": dp}
        for zero in (1, 3):
            b = largest_batch(model, zero, pp, dp)
            row["zero%d_batch" % zero] = b[0] if b else None
            row["zero%d_peak_gib" % zero] = b[1] / 2**30 if b else None
        row["ratio"] = common.ratio(row.get("zero3_batch"), row.get("zero1_batch"))
        rows.append(row)
    return rows


def main():
    rows = schedule_rows()
    columns = [("model", "model"), ("size", "size")] + [(n + "_s", n + " s") for n, _ in SCHEDULES] + [
        ("dualpipev_gain", "DualPipeV gain"), ("gain_over", "over"), ("published_gain", "published gain")]
    notes = ["Gain = step time of the schedule named in `over` / DualPipeV's step time (simulated, one DGX H100 node,",
             "pp=4, dp=2, ZeRO-1, m=8, seq 4096). Published: ../shared/reference/schedules.md 4.5 [secondary]."]
    common.write_table("schedules", "Pipeline schedules on a ~1B and a ~9B model", columns, rows, notes,
                       extra={"published": PUBLISHED})
    common.plot("schedules", "Simulated step time per schedule (1 DGX H100 node, pp=4, dp=2)", "model",
                "step time (s)", [(n, [r["model"] for r in rows], [r.get(n + "_s") for r in rows])
                                  for n, _ in SCHEDULES], kind="bar")
    batch = batch_rows()
    columns = [("model", "model"), ("pp", "pp"), ("dp", "dp"), ("zero1_batch", "largest batch ZeRO-1"),
               ("zero1_peak_gib", "its peak GiB"), ("zero3_batch", "largest batch ZeRO-3"),
               ("zero3_peak_gib", "its peak GiB"), ("ratio", "ZeRO-3 / ZeRO-1")]
    notes = ["Global batch = dp x 2pp microbatches x mbs; the largest mbs (doubled, then bisected) whose compiled",
             "1F1B plan fits in 80 GiB (H100). With dp = 1 ZeRO shards nothing (the control row). Published claim (issue 30, from the programmable-training design; not in",
             "../shared/reference): 3-8x."]
    common.write_table("zero3_batch", "Largest global batch that fits: PP x ZeRO-3 against PP x ZeRO-1", columns,
                       batch, notes)
    labels = ["%s pp=%d" % (r["model"], r["pp"]) for r in batch]
    common.plot("zero3_batch", "Largest global batch that fits (1 DGX H100 node)", "model, pipeline",
                "sequences per step", [("ZeRO-1", labels, [r.get("zero1_batch") for r in batch]),
                                       ("ZeRO-3", labels, [r.get("zero3_batch") for r in batch])], kind="bar")


if __name__ == "__main__":
    main()
