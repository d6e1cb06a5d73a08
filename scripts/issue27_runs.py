"""Issue 27's strategies on 4 local ranks and the `piper train --json` run both tables use
(scripts/memory-table.py: peak memory per rank; scripts/step-table.py: step time)."""
import json
import subprocess

# dp, pp (1f1b, interleaved, zb-h1, dualpipev), tp with sp, ep (flat and HALO), ZeRO 1-3 and af-pipe.
STRATEGIES = [
    "dp=4,zero=1,microbatches=1,mbs=4",
    "dp=4,zero=2,microbatches=2,mbs=2",
    "dp=4,zero=3,microbatches=2,mbs=2",
    "pp=4,schedule=1f1b,microbatches=8,mbs=2",
    "dp=2,pp=2,schedule=1f1b,microbatches=4,mbs=2",
    "dp=2,pp=2,vpp=2,schedule=interleaved,microbatches=4,mbs=2",
    "dp=2,pp=2,schedule=zb-h1,microbatches=4,mbs=2",
    "dp=2,pp=2,schedule=dualpipev,microbatches=4,mbs=2",
    "dp=2,tp=2,sp=1,microbatches=2,mbs=4",
    "dp=4,ep=4,microbatches=1,mbs=4",
    "dp=4,ep=4,a2a=halo,microbatches=1,mbs=4",
    "dp=2,pp=2,ep=2,schedule=dualpipev,microbatches=4,mbs=2",
    "dp=2,ep=2,pp=1,schedule=af-pipe,disagg=1,attn_ranks=2,ffn_ranks=2,microbatches=8,mbs=1",
]


def train(piper, model, strategy, steps, batch="16", seq="128", extra=()):
    """`piper train --json` on 4 ranks (HALO with 2 ranks per emulated node); the parsed report, or the error's last
    line as a string."""
    cmd = [piper, "train", "--model", model, "--ranks", "4", "--steps", str(steps), "--global-batch", str(batch),
           "--seq", str(seq), "--strategy", strategy, "--json"] + list(extra)
    if "halo" in strategy:
        cmd += ["--ranks-per-node", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return ((out.stdout + out.stderr).strip().splitlines() or ["exit %d" % out.returncode])[-1]
    return json.loads(out.stdout)
