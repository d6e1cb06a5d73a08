#!/usr/bin/env python3
"""Loads a Hugging Face config.json and prints the best plan Piper finds for it on a cluster.

    PYTHONPATH=build/python python3 examples/python/best_plan.py tests/data/hf/mixtral-8x22b/config.json \
        --cluster dgx-h100 --nodes 8 --global-batch 256 --seq 4096 --verify-attempts 10

Prints the model, the top plans (closed-form step time, MFU, peak memory per device, and the simulated step when
the planner re-scored it) and the memory breakdown of the best plan per pipeline rank (piper.estimate).
"""
import argparse
import sys

import piper
import piper.plot


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", help="a Hugging Face config.json")
    p.add_argument("--cluster", default="dgx-h100")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=256)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--top", type=int, default=3)
    p.add_argument("--verify-attempts", type=int, default=3, help="compilations per plan returned (as piper plan)")
    p.add_argument("--simulate-top", type=int, default=None, help="plans re-scored by the simulator (default: --top)")
    p.add_argument("--memory-png", help="also save the best plan's memory per pipeline rank as a PNG")
    p.add_argument("--report", help="also write `piper plan --report`'s charts of the plans (.html or .svg)")
    a = p.parse_args(argv)
    try:
        model = piper.Model.from_hf_config(a.config)
        cluster = piper.Cluster.preset(a.cluster, nodes=a.nodes)
        result = piper.plan(model, cluster, global_batch=a.global_batch, seq=a.seq, top=a.top,
                            verify_attempts=a.verify_attempts, simulate_top=a.simulate_top,
                            local_search=0 if a.simulate_top == 0 else 8, report=a.report)
    except piper.Error as e:  # the CLI's one-line message
        print("error: %s" % e, file=sys.stderr)
        return 1
    print("model   %s (%d layers) on %d x %s (%d devices), global batch %d x %d tokens"
          % (model.name, model.to_dict()["num_layers"], cluster.nodes, cluster.name, cluster.world_size,
             a.global_batch, result.seq_len))
    for i, plan in enumerate(result.plans):
        sim = " simulated %.3f s" % plan.simulated_step_time_s if plan.simulated else ""
        print("#%d  %-90s step %.3f s  MFU %4.1f %%  peak %5.1f GiB%s"
              % (i + 1, plan.strategy, plan.step_time_s, 100 * plan.mfu, plan.peak_memory_bytes / 2**30, sim))
    best = piper.estimate(model, cluster, result.best, global_batch=a.global_batch, seq=a.seq)
    print("best    %s" % result.best)
    for r in best.ranks:
        print("  pp %-3d params %6.1f GiB  grads %6.1f GiB  optimizer %6.1f GiB  activations %6.1f GiB  total %6.1f GiB"
              % (r.pp_rank, r.params / 2**30, r.grads / 2**30, r.optimizer / 2**30, r.activations / 2**30,
                 r.total / 2**30))
    if a.memory_png:
        piper.plot.memory(best, a.memory_png)
        print("wrote %s" % a.memory_png)
    if a.report:
        print("wrote %s" % a.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
