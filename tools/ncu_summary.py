#!/usr/bin/env python3
"""Per-kernel summary of one decode step from an `ncu --csv --page raw` log of `lily bench` (tools/gpu_ncu.sh):
takes the kernels from the last embed_kernel launch on (the last replayed step) and prints launches, total and
per-launch time per kernel name, and the step's kernel-time sum."""
import csv
import io
import sys
from collections import defaultdict

text = open(sys.argv[1]).read()
rows = list(csv.reader(io.StringIO(text[text.index('"ID"'):])))
hdr, data = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
name_i, t_i, g_i = hdr.index("Kernel Name"), hdr.index("gpu__time_duration.sum"), hdr.index("launch__grid_size")
starts = [i for i, r in enumerate(data) if "embed_kernel" in r[name_i]]
step = data[starts[-1]:] if starts else data
agg = defaultdict(lambda: [0, 0.0, set()])
for r in step:
    name = r[name_i].split("(")[0].replace("void ", "").replace("(anonymous namespace)::", "")[:70]
    t = float(r[t_i].replace(",", "")) / 1000.0
    a = agg[name]
    a[0] += 1
    a[1] += t
    a[2].add(r[g_i])
total = sum(a[1] for a in agg.values())
print(f"{'kernel':70s} {'n':>4s} {'us':>8s} {'us/launch':>9s}  grids")
for name, (n, t, grids) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{name:70s} {n:4d} {t:8.1f} {t / n:9.2f}  {','.join(sorted(grids))[:30]}")
print(f"{len(step)} kernels, sum of kernel times {total:.1f} us")
