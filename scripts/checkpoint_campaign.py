#!/usr/bin/env python3
"""Hostile checkpoints against `piper train --resume` (docs/reliability.md, *Checkpoints*).

Saves a tiny-moe checkpoint, damages or edits copies of it in every way the docs list, resumes from each and
prints one row per case: the exit code and the error line. A case passes when the resume exits non-zero with a
message containing the expected words (and, unless the model really differs, without "another model"), and the
damaged checkpoint is byte-for-byte unchanged by the failed resume.

    python3 scripts/checkpoint_campaign.py build/src/cli/piper [WORKDIR]
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

TRAIN = ["train", "--model", "tiny-moe", "--seq", "16", "--seed", "1234", "--warmup", "2", "--strategy",
         "microbatches=4,mbs=1"]


def header(path):
    data = open(path, "rb").read()
    n = int.from_bytes(data[:8], "little")
    return data, n


def edit_header(path, old, new):
    data, n = header(path)
    assert len(old) == len(new)
    at = data.find(old)
    assert 8 <= at < 8 + n, old
    open(path, "wb").write(data[:at] + new + data[at + len(old):])


def transpose_first_matrix(path):
    data, n = header(path)
    h = json.loads(data[8:8 + n])
    for name, e in h.items():
        if name != "__metadata__" and len(e["shape"]) == 2 and e["shape"][0] != e["shape"][1]:
            a, b = e["shape"]
            edit_header(path, json.dumps({"shape": [a, b]}, separators=(",", ":"))[1:-1].encode(),
                        json.dumps({"shape": [b, a]}, separators=(",", ":"))[1:-1].encode())
            return f"{name} [{a},{b}] -> [{b},{a}]"
    raise RuntimeError("no 2-D tensor")


def flip(path, offset_from_end):
    data = bytearray(open(path, "rb").read())
    data[-offset_from_end] ^= 0x10
    open(path, "wb").write(bytes(data))


def edit_index(step_dir, fn):
    path = os.path.join(step_dir, "index.json")
    index = json.load(open(path))
    fn(index)
    open(path, "w").write(json.dumps(index, indent=1))


def digest(root):
    h = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            h.update(f.encode() + open(os.path.join(dirpath, f), "rb").read())
    return h.hexdigest()


def main():
    piper = os.path.abspath(sys.argv[1])
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="piper_ckpt_campaign_")
    os.makedirs(work, exist_ok=True)
    good = os.path.join(work, "good")
    shutil.rmtree(good, ignore_errors=True)
    subprocess.run([piper] + TRAIN + ["--steps", "2", "--save", good], check=True, capture_output=True)
    step = os.path.join(good, "step-00000002")
    rank0 = os.path.join(step, "rank-00000.safetensors")
    other = os.path.join(work, "tiny-moe-2l.json")
    spec = json.load(open(os.path.join(os.path.dirname(__file__), "..", "configs", "models", "tiny-moe.json")))
    spec["name"], spec["num_layers"] = "tiny-moe-2l", 2
    json.dump(spec, open(other, "w"))
    cases = [
        ("transposed shape in a header", lambda d: transpose_first_matrix(d["rank0"]), "in its header, the index says"),
        ("bit flip in tensor data", lambda d: flip(d["rank0"], 5), "does not match its checksum"),
        ("bit flip in header metadata", lambda d: edit_header(d["rank0"], b'"format":"pt"', b'"format":"pu"'),
         "whole file does not match its checksum"),
        ("bit flip in a header name", lambda d: edit_header(d["rank0"], b'"L0.attn.wo"', b'"L0.attn.wn"'),
         "that the index does not list"),
        ("truncated file", lambda d: open(d["rank0"], "r+b").truncate(os.path.getsize(d["rank0"]) - 8), "truncated"),
        ("missing rank file", lambda d: os.remove(d["rank0"]), "is missing"),
        ("step edited to 1e15", lambda d: edit_index(d["step"], lambda j: j.update(step=1e15)),
         "step must be an integer in [0, 1000000000000]"),
        ("step edited to -1", lambda d: edit_index(d["step"], lambda j: j.update(step=-1)), "step must be an integer"),
        ("step edited to 7", lambda d: edit_index(d["step"], lambda j: j.update(step=7)), "but the directory is"),
        ("model edited to \"mixtral-8x7b\"", lambda d: edit_index(d["step"], lambda j: j.update(model="mixtral-8x7b")),
         "model is not a JSON object"),
        ("model name edited", lambda d: edit_index(d["step"], lambda j: j["model"].update(name="mixtral-8x7b")),
         "do not match its index_fnv1a64"),
        ("seed edited", lambda d: edit_index(d["step"], lambda j: j["rng"].update(seed=1)),
         "do not match its index_fnv1a64"),
        ("unknown key", lambda d: edit_index(d["step"], lambda j: j.update(stpe=2)), "unknown key 'stpe'"),
        ("missing key", lambda d: edit_index(d["step"], lambda j: j.pop("seq_len")), "lacks the key 'seq_len'"),
        ("version 2", lambda d: edit_index(d["step"], lambda j: j.update(version=2)), "format version 2"),
        ("dtype BF16", lambda d: edit_index(d["step"], lambda j: j["tensors"]["L0.attn.wo"].update(dtype="BF16")),
         "dtype BF16"),
        ("latest names a missing step", lambda d: open(os.path.join(d["root"], "latest"), "w").write("step-9\n"),
         "latest"),
    ]
    failures = 0
    print(f"| case | exit | message |\n|---|---|---|")
    for name, damage, expect in cases + [("another model (2 layers)", None, "was written for another model")]:
        root = os.path.join(work, "case")
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(good, root)
        d = {"root": root, "step": os.path.join(root, "step-00000002"),
             "rank0": os.path.join(root, "step-00000002", "rank-00000.safetensors")}
        if damage is not None:
            damage(d)
        before = digest(root)
        args = TRAIN if damage is not None else [a if a != "tiny-moe" else other for a in TRAIN]
        r = subprocess.run([piper] + args + ["--steps", "1", "--resume", root], capture_output=True, text=True)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        msg = lines[-1] if lines else "(no message)"
        ok = r.returncode != 0 and expect in msg and digest(root) == before
        if damage is not None and "another model" in msg:
            ok = False
        failures += not ok
        print(f"| {name} | {r.returncode} | {'' if ok else 'FAIL: '}{msg} |")
    # --save DIR that cannot be written: refused before the first step.
    blocker = os.path.join(work, "a-file")
    open(blocker, "w").write("x")
    r = subprocess.run([piper] + TRAIN + ["--steps", "1000", "--save", os.path.join(blocker, "ckpt")],
                       capture_output=True, text=True)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    msg = lines[-1] if lines else ""
    stepped = any(re.match(r"step\s+\d", l) for l in r.stdout.splitlines())
    ok = r.returncode != 0 and "Not a directory" in msg and not stepped
    failures += not ok
    print(f"| --save under a file | {r.returncode} | {'' if ok else 'FAIL: '}{msg} |")
    shutil.rmtree(work, ignore_errors=True)
    print(f"\n{len(cases) + 2 - failures} of {len(cases) + 2} refused as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
