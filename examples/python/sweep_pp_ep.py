#!/usr/bin/env python3
"""A sweep of pipeline x expert parallelism for mixtral-8x7b on 8 dgx-h100 nodes (64 GPUs), saved as a PNG.

    PYTHONPATH=build/python python3 examples/python/sweep_pp_ep.py sweep.png

For each ep in {1, 2, 4, 8} one line of closed-form step time (piper.estimate) against pp in {1, 2, 4, 8}, with
dp = 64 / pp, ZeRO-1 and the global batch of 256 sequences of 4096 tokens; a strategy that does not fit in device memory
is left out of its line and listed.
"""
import sys

import piper
import piper.plot

GLOBAL_BATCH = 256


def main(path):
    model = piper.Model.preset("mixtral-8x7b")
    cluster = piper.Cluster.preset("dgx-h100", nodes=8)
    ax = None
    for ep in (1, 2, 4, 8):
        fitting = []
        for pp in (1, 2, 4, 8):
            dp = cluster.world_size // pp
            s = piper.Strategy(dp=dp, pp=pp, ep=ep, microbatches=GLOBAL_BATCH // dp, schedule="1f1b",
                               zero=1)
            e = piper.estimate(model, cluster, s, seq=4096)
            if e.fits:
                fitting.append(e)
            else:
                print("does not fit: %s (%.1f GiB on pipeline rank %d)" % (s, e.memory.total / 2**30, e.worst_rank))
        if fitting:
            fig = piper.plot.sweep(fitting, x="pp", y="step_time_s", label="ep=%d" % ep, ax=ax)
            ax = fig.axes[0]
            for e in fitting:
                print("ep=%d pp=%d dp=%-3d step %.3f s  MFU %.1f %%" % (ep, e.strategy.pp, e.strategy.dp,
                                                                      e.step_time_s, 100 * e.mfu))
    ax.set_title("mixtral-8x7b on 8 x dgx-h100, global batch %d x 4096" % GLOBAL_BATCH)
    ax.legend()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    print("wrote %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "sweep_pp_ep.png"))
