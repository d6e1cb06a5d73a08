#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/corpus/<target>/ from the repository's own inputs (configs/, tests/data/hf)
and from small hand-made ones (strategies, calibrations, directives, a checkpoint index, safetensors and token
files). Run once from the repository root; the corpora are committed, so CI does not run this.
Regression inputs (fuzz/corpus/<target>/crash-*) are added by hand and never rewritten here."""
import glob
import json
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def copy_files(target, pattern, name_of):
    for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
        put(target, name_of(path), open(path, "rb").read())


STRATEGIES = [
    "dp=1", "dp=2,pp=2,microbatches=4", "dp=16,pp=4,ep=8,zero=1,microbatches=16,recompute=selective",
    "dp=16,pp=4,vpp=2,ep=8,zero=1,microbatches=16,schedule=interleaved",
    "dp=128,tp=2,sp=1,pp=1,ep=8,fold=1,zero=3,mbs=4,microbatches=4,recompute=full",
    "dp=16,pp=2,ep=16,schedule=dualpipev,microbatches=4", "dp=8,pp=2,schedule=zb-h1,microbatches=8",
    "dp=1,recompute_modules=layernorm+moe_act,microbatches=2", "dp=4,ep=4,a2a=halo,ep_overlap=1",
    "dp=2,tp=2,tp_overlap=1,etp=2", "disagg=1,attn_ranks=2,ffn_ranks=2,schedule=af-pipe,microbatches=4",
    "dp=4,order=tp-ep-dp-pp,pp=1", "dp=2,pp=2,schedule=gpipe,microbatches=2,mbs=2",
    "dp=2,ep=2,schedule=af-pipe,microbatches=4,disagg=1,attn_ranks=2,ffn_ranks=2,attn_ports=1,ffn_ports=3",
]


def strategies():
    for i, s in enumerate(STRATEGIES):
        put("strategy_string", "seed-%02d" % i, s)
    objs = [{"dp": 2, "pp": 2, "microbatches": 4},
            {"dp": 16, "pp": 4, "ep": 8, "zero": 1, "microbatches": 16, "recompute": "selective",
             "schedule": "1f1b", "mbs": 1},
            {"dp": 16, "pp": 4, "vpp": 2, "schedule": "interleaved", "microbatches": 16, "sp": True, "tp": 2},
            {"dp": 4, "ep": 4, "a2a": "halo", "order": ["tp", "ep", "dp", "pp"], "fold": False},
            {"dp": 1, "recompute_modules": ["layernorm", "moe_act"], "microbatches": 2, "tp_overlap": 0},
            {"disagg": 1, "attn_ranks": 2, "ffn_ranks": 2, "schedule": "af-pipe", "microbatches": 4},
            {"disagg": 1, "attn_ranks": 2, "ffn_ranks": 2, "attn_ports": 3, "ffn_ports": 5, "schedule": "af-pipe",
             "microbatches": 4}]
    for i, o in enumerate(objs):
        put("strategy_json", "seed-%02d.json" % i, json.dumps(o))


def calibrations():
    put("compute_calibration", "full.json", json.dumps(
        {"gemm_efficiency": 0.72, "gemm_half_dim": 96, "memory_bw_efficiency": 0.85, "workspace_bytes": 1073741824,
         "expert_load_imbalance": 1.1, "attention_score_bytes": 13, "recompute_reruns_tp_collectives": True,
         "tp_overlap_gemm_sm_share": 0.88}))
    put("compute_calibration", "empty.json", "{}")
    put("compute_calibration", "one.json", '{"gemm_efficiency": 0.5}')
    put("comm_calibration", "full.json", json.dumps(
        {"source": "piper bench comm", "ranks": 16, "ranks_per_node": 8,
         "node": {"intra": {"latency_s": 3e-6, "bw_bytes_per_s": 1.5e11}, "nic_latency_s": 5e-6,
                  "nic_bw_bytes_per_s": 2.5e10}}))
    put("comm_calibration", "intra.json", '{"node": {"intra": {"latency_s": 1e-6, "bw_bytes_per_s": 2e11}}}')
    put("comm_calibration", "empty.json", "{}")


def expert_loads():
    def loads(layers, experts=8, model="tiny-moe", steps=6):
        return json.dumps({"format": "piper-expert-loads", "version": 1, "model": model, "num_experts": experts,
                           "steps": steps, "layers": [{"layer": l, "tokens": t} for l, t in layers]}, indent=1)
    put("expert_loads", "skewed.json", loads([(1, [3072, 2578, 494, 0, 0, 0, 0, 0]), (2, [3072, 3072, 0, 0, 0, 0, 0, 0])]))
    put("expert_loads", "balanced.json", loads([(0, [100] * 8)]))
    put("expert_loads", "one_expert.json", loads([(3, [7])], experts=1, model="x", steps=1))
    put("expert_loads", "busiest_v2.json", loads_v2([1, 3], [[[6, 2, 0, 0], [2, 2, 2, 2]], [[0, 0, 4, 4], [0, 0, 0, 8]],
                                                          [[3, 3, 1, 1], [5, 1, 1, 1]]]))


def loads_v2(layers, steps, model="tiny-moe"):
    """A version-2 loads file as `piper train --record-expert-loads` writes it from per-step loads
    (steps[s][i][e]: rows of expert e in layer layers[i] during step s + 1): the sums and, for every ep that divides
    the experts, each ep rank's step with the most rows over the layers (the first such step), and every step's."""
    experts = len(steps[0][0])
    busiest = []
    for ep in [d for d in range(2, experts + 1) if experts % d == 0]:
        per, ranks = experts // ep, []
        for r in range(ep):
            rows = [[sum(layer[r * per:(r + 1) * per]) for layer in step] for step in steps]
            best = max(range(len(steps)), key=lambda s: (sum(rows[s]), -s))
            ranks.append({"step": best + 1, "tokens": rows[best]})
        busiest.append({"ep": ep, "ranks": ranks})
    sums = [[sum(step[i][e] for step in steps) for e in range(experts)] for i in range(len(layers))]
    return json.dumps({"format": "piper-expert-loads", "version": 2, "model": model, "num_experts": experts,
                       "steps": len(steps), "layers": [{"layer": l, "tokens": t} for l, t in zip(layers, sums)],
                       "busiest_steps": busiest, "step_tokens": steps}, indent=1)


def directives():
    lists = [
        [{"directive": "split", "microbatches": 4},
         {"directive": "place", "filter": {"layer": "0-3"}, "stage": 0},
         {"directive": "place", "filter": {"stage": 0}, "rank": 0},
         {"directive": "order", "rank": 0, "stream": "compute",
          "slots": ["0F0", ["0F1", "0BW0"], {"stage": 0, "pass": "B"}]},
         {"directive": "stream", "filter": {"pass": "W"}, "stream": "wgrad"},
         {"directive": "recompute", "filter": {"part": "attn"}},
         {"directive": "recompute", "filter": {"pass": "F"}, "modules": "layernorm+moe_act"}],
        [{"directive": "split", "microbatches": 2},
         {"directive": "replicate", "filter": {}, "zero": 3, "reduce": "reduce_scatter", "bucket_mb": 25},
         {"directive": "shard", "filter": {"part": "experts"}, "axis": "ep", "algorithm": "halo"},
         {"directive": "shard", "filter": {"part": "attn"}, "axis": "tp", "algorithm": "ring",
          "sequence_parallel": True},
         {"directive": "replicate", "filter": {"part": "attn"}, "zero": 1, "param_gather": "before_forward"}],
        [{"directive": "disaggregate", "attn_groups": 2, "ffn_groups": 2}],
        [{"directive": "split", "microbatches": 4},
         {"directive": "place", "filter": {"layer": "0-1"}, "stage": 0},
         {"directive": "place", "filter": {"layer": "2-3"}, "stage": 1},
         {"directive": "place", "filter": {"stage": 0}, "rank": 0},
         {"directive": "place", "filter": {"stage": 1}, "rank": 1},
         {"directive": "order", "rank": 0, "slots": ["0F0", "0F1", "0B0", "0F2", "0B1", "0F3", "0B2", "0B3"]},
         {"directive": "order", "rank": 1, "slots": ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1F3", "1B3"]}],
        [{"directive": "disaggregate", "attn_groups": 1, "ffn_groups": 3, "attn_ports": 2, "ffn_ports": 6}],
    ]
    for i, l in enumerate(lists):
        put("directive_json", "seed-%02d.json" % i, json.dumps({"directives": l} if i % 2 == 0 else l))


def safetensors(tensors, metadata=None):
    header, data, offset = {}, b"", 0
    if metadata:
        header["__metadata__"] = metadata
    for name, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + 4 * n]}
        data += struct.pack("<%df" % n, *[0.5 * i for i in range(n)])
        offset += 4 * n
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + data


def checkpoints():
    put("safetensors", "two.safetensors", safetensors([("L0.attn.wq", [4, 2]), ("L0.attn.wq.m", [3])],
                                                      {"format": "pt"}))
    put("safetensors", "scalar.safetensors", safetensors([("s", []), ("e", [0, 3])]))
    put("safetensors", "empty.safetensors", safetensors([]))
    index = {"format": "piper-checkpoint", "version": 2, "step": 12, "data_position": {"epoch": 0, "index": 96},
             "rng": {"seed": 1, "stream": 0, "counter": 7}, "seq_len": 64, "model": "tiny-moe",
             "strategy": "dp=2,ep=2", "world_size": 2, "expert_placement": {"1": [0, 1, 2, 3]},
             "files": {"rank-00000.safetensors": {"bytes": 120, "fnv1a64": "0123456789abcdef"},
                       "rank-00001.safetensors": {"bytes": 120, "fnv1a64": "fedcba9876543210"}},
             "tensors": {
                 "L0.attn.wq": {"shape": [4, 2], "optimizer": False, "pieces": [
                     {"file": "rank-00000.safetensors", "key": "L0.attn.wq", "offset": [0, 0], "extent": [4, 2],
                      "range": [0, 8]}]},
                 "L1.experts.w1": {"shape": [4, 3, 2], "optimizer": False, "pieces": [
                     {"file": "rank-00000.safetensors", "key": "L1.experts.w1@[0,0,0]+[2,3,2]#[0:12]",
                      "offset": [0, 0, 0], "extent": [2, 3, 2], "range": [0, 12]},
                     {"file": "rank-00001.safetensors", "key": "L1.experts.w1@[2,0,0]+[2,3,2]#[0:12]",
                      "offset": [2, 0, 0], "extent": [2, 3, 2], "range": [0, 12]}]},
                 "L0.attn.wq.m": {"shape": [4, 2], "optimizer": True, "pieces": [
                     {"file": "rank-00000.safetensors", "key": "L0.attn.wq.m@[0,0]+[4,2]#[0:4]", "offset": [0, 0],
                      "extent": [4, 2], "range": [0, 4]},
                     {"file": "rank-00001.safetensors", "key": "L0.attn.wq.m@[0,0]+[4,2]#[4:8]", "offset": [0, 0],
                      "extent": [4, 2], "range": [4, 8]}]}}}
    put("checkpoint_index", "index.json", json.dumps(index, indent=1))
    small = dict(index, tensors={}, files={}, expert_placement={})
    put("checkpoint_index", "empty-index.json", json.dumps(small))


def token_files():
    # First byte: bit 0 = token file (.u16), bit 1 = no +256 on the vocabulary; then the vocabulary (LE uint16).
    text = b"Q: Why did the chicken cross the road?\nA: To get to the other side.\n%\n"
    put("token_file", "text", b"\x00\x00\x00" + text)
    put("token_file", "utf8-text", b"\x00\x00\x01" + "naïve café — ünïcödé\n".encode())
    put("token_file", "tokens-256", b"\x01\x00\x00" + struct.pack("<8H", 1, 2, 3, 255, 0, 17, 128, 64))
    put("token_file", "tokens-50257", b"\x03" + struct.pack("<H", 50257) + struct.pack("<6H", 50256, 0, 1, 464, 3290, 13))
    put("token_file", "tokens-odd", b"\x01\x00\x00\x01\x02\x03")


JSON_TOKENS = ["{", "}", "[", "]", ":", ",", '"', "true", "false", "null", "-1", "0", "1e400", "-1e400", "1e308",
               "18446744073709551615", "9223372036854775808", "2147483648", "-2147483649", "0.5", "1e-400"]


def words_of(value, out):
    if isinstance(value, dict):
        for k, v in value.items():
            out.add(k)
            words_of(v, out)
    elif isinstance(value, list):
        for v in value:
            words_of(v, out)
    elif isinstance(value, str) and len(value) < 40:
        out.add(value)


def write_dict(target, words):
    os.makedirs(os.path.join(ROOT, "fuzz", "dict"), exist_ok=True)
    with open(os.path.join(ROOT, "fuzz", "dict", target + ".dict"), "w") as f:
        f.write("# libFuzzer dictionary of %s, written by fuzz/make_seeds.py from its seed corpus\n" % target)
        for w in sorted(words):
            f.write('"%s"\n' % "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "\\x%02x" % b
                                        for c in w for b in c.encode()))


def dictionaries():
    for target in sorted(os.listdir(CORPUS)):
        words = set()
        if target == "strategy_string":
            for s in STRATEGIES:
                for part in s.split(","):
                    key, _, value = part.partition("=")
                    words.update([key + "=", value, ","])
            words.update(["=0", "=-1", "=2147483647", "=2147483648", "=99999999999999999999", "+", "-"])
        elif target in ("safetensors", "token_file"):
            continue
        else:
            for path in glob.glob(os.path.join(CORPUS, target, "*")):
                try:
                    words_of(json.load(open(path)), words)
                except ValueError:
                    pass
            words = {'"%s"' % w for w in words if '"' not in w and "\\" not in w}
            words.update(JSON_TOKENS)
        write_dict(target, words)
    write_dict("safetensors", set(JSON_TOKENS) | {'"dtype"', '"F32"', '"F16"', '"shape"', '"data_offsets"',
                                                   '"__metadata__"', "\x00\x00\x00\x00\x00\x00\x00"})


def main():
    copy_files("model_json", "configs/models/*.json", os.path.basename)
    copy_files("model_json", "tests/data/hf/*/config.json", lambda p: "hf-" + os.path.basename(os.path.dirname(p)))
    copy_files("hf_config", "tests/data/hf/*/config.json", lambda p: os.path.basename(os.path.dirname(p)) + ".json")
    copy_files("cluster_json", "configs/clusters/*.json", os.path.basename)
    # CPU ranks sharing their node's cores (node.shared_cores, node.device_cores): no preset carries them.
    cpu = json.load(open(os.path.join(ROOT, "configs", "clusters", "local-cpu.json")))
    cpu["node"].update(devices_per_node=4, shared_cores=2, device_cores=1)
    put("cluster_json", "cpu-shared-cores.json", json.dumps(cpu, indent=2))
    put("train_json", "full.json", json.dumps(
        {"global_batch": 64, "micro_batch_size": 2, "seq_len": 128, "param_dtype": "fp32", "grad_dtype": "bf16",
         "master_dtype": "fp32", "optimizer": {"name": "adamw", "lr": 1e-3, "beta1": 0.9, "beta2": 0.95,
                                               "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0}}))
    put("train_json", "small.json", '{"global_batch": 8}')
    strategies()
    calibrations()
    directives()
    expert_loads()
    checkpoints()
    token_files()
    dictionaries()


if __name__ == "__main__":
    main()
