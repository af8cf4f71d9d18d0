#!/usr/bin/env python3
"""Per-kernel summary of one decode step or batched decode pass from an `ncu --csv --page raw` log of `lily bench`
(tools/gpu_ncu.sh): takes the launches from the second-to-last embed_kernel launch to the last one (one whole step
or pass; from the last one on where there is only one) and prints launches, total and per-launch time per kernel
name, and where the log has DRAM bytes (dram__bytes_read / write) the bytes per launch and GB/s."""
import csv
import io
import re
import sys
from collections import defaultdict

text = open(sys.argv[1]).read()
rows = list(csv.reader(io.StringIO(text[text.index('"ID"'):])))
hdr, data = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
name_i, t_i, g_i = hdr.index("Kernel Name"), hdr.index("gpu__time_duration.sum"), hdr.index("launch__grid_size")
byte_i = [hdr.index(m) for m in ("dram__bytes_read.sum", "dram__bytes_write.sum") if m in hdr]
starts = [i for i, r in enumerate(data) if "embed_kernel" in r[name_i]]
step = data[starts[-2]:starts[-1]] if len(starts) >= 2 else data[starts[-1]:] if starts else data
agg = defaultdict(lambda: [0, 0.0, 0.0, set()])
for r in step:
    name = r[name_i].replace("void ", "").replace("lily::cuda::", "")
    name = re.sub(r"(\(anonymous namespace\)|<?unnamed>)::", "", name)  # (ncu shortens it to "unnamed>")
    # the template arguments stay; of the parameters only the first (it tells apart kernels of one name in two files)
    m = re.match(r"([^(]*)\(([^,)]*)", name)
    name = f"{m.group(1)}({m.group(2)})"[:70] if m else name[:70]
    a = agg[name]
    a[0] += 1
    a[1] += float(r[t_i].replace(",", "")) / 1000.0
    a[2] += sum(float(r[i].replace(",", "")) for i in byte_i)
    a[3].add(r[g_i])
total = sum(a[1] for a in agg.values())
print(f"{'kernel':70s} {'n':>4s} {'us':>8s} {'us/launch':>9s} {'share':>6s}" +
      (f" {'MB/launch':>9s} {'GB/s':>6s}" if byte_i else "") + "  grids")
for name, (n, t, b, grids) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    line = f"{name:70s} {n:4d} {t:8.1f} {t / n:9.2f} {100 * t / total:5.1f}%"
    if byte_i:
        line += f" {b / n / 1e6:9.2f} {b / (t * 1e3):6.0f}"
    print(line + f"  {','.join(sorted(grids))[:30]}")
print(f"{len(step)} kernels, sum of kernel times {total:.1f} us")
