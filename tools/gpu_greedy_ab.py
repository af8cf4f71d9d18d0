#!/usr/bin/env python3
"""Greedy ids of several lily binaries on the golden fixtures (tests/data/golden/{hf,mlx}), through `lily generate`
on the GPU: prints each binary's ids per case and whether every binary agrees (and agrees with transformers'
greedy ids stored in the fixture). Usage: gpu_greedy_ab.py REPO_ROOT BIN [BIN ...]"""
import json
import subprocess
import sys

root, bins = sys.argv[1], sys.argv[2:]
same = True
for fixture in ("hf", "mlx"):
    d = "%s/tests/data/golden/%s" % (root, fixture)
    cases = json.load(open(d + "/golden/golden.json"))["cases"]
    for i, c in enumerate(cases):
        outs = []
        for b in bins:
            r = subprocess.run([b, "generate", "--model", d, "--tokens", " ".join(map(str, c["prompt"])),
                                "--max-tokens", str(len(c["greedy"])), "--temperature", "0", "--ignore-eos",
                                "--print-ids", "--device", "cuda"], capture_output=True, text=True, timeout=300)
            outs.append(r.stdout.strip() if r.returncode == 0 else "FAILED: " + r.stderr.strip()[-200:])
        agree = len(set(outs)) == 1
        same = same and agree
        ref = " ".join(map(str, c["greedy"]))
        print("%s case %d (%d prompt tokens): binaries %s, transformers %s" %
              (fixture, i, len(c["prompt"]), "agree" if agree else "DIFFER", "same" if outs[0] == ref else "differs"))
        if not agree:
            for b, o in zip(bins, outs):
                print("   %s: %s" % (b, o))
print("greedy ids identical across binaries: %s" % same)
sys.exit(0 if same else 1)
