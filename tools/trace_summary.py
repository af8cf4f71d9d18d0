#!/usr/bin/env python3
"""Summarises a kernel timeline written by bench/kernel_trace.cpp (CUDA_INJECTION64_PATH=libkernel_trace.so).

For each replayed CUDA graph (the decode graph, a batch pass's graph per row count): the replays' median span and,
per kernel, the median time it holds the critical path ("exposed": its end minus the later of its start and the
previous kernels' last end, so overlapped launches under PDL are not counted twice), its median duration and the
idle time before it. The exposed times and idle gaps of a replay add up to its span. --between: the kernels that
run between a graph's replays (a step's tail outside its graph), as offsets from the replay's end; the memcpys
and, in a trace taken with LILY_TRACE_API=1, the host's CUDA calls ("api:<call>", stream 0) are among them.

  python3 tools/trace_summary.py kernel_trace.csv [--graph ID] [--nodes] [--between] [--min-replays N]
"""
import argparse
import collections
import csv
import statistics


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("start_ns", "end_ns", "stream", "graph_id", "graph_node", "grid", "block", "regs"):
            r[k] = int(r[k])
    return rows


def replays(kernels):
    """Splits one graph's kernels (sorted by start) into replays: a node seen again starts the next one."""
    out, cur, seen = [], [], set()
    for k in kernels:
        if k["graph_node"] in seen:
            out.append(cur)
            cur, seen = [], set()
        cur.append(k)
        seen.add(k["graph_node"])
    if cur:
        out.append(cur)
    return out


def usual(seqs):
    """The sequences of the most common length (a trace may start or end inside a replay), and that length."""
    n = collections.Counter(len(x) for x in seqs).most_common(1)[0][0]
    return [x for x in seqs if len(x) == n], n


def critical(replay):
    """Per kernel of a replay (by start): (exposed ns, idle ns before it)."""
    res, last_end = [], replay[0]["start_ns"]
    for k in replay:
        idle = max(0, k["start_ns"] - last_end)
        exposed = max(0, k["end_ns"] - max(k["start_ns"], last_end))
        res.append((exposed, idle))
        last_end = max(last_end, k["end_ns"])
    return res


def summarise_graph(gid, reps, show_nodes):
    """reps: the graph's complete replays, each sorted by start."""
    n_nodes = len(reps[0])
    spans = [max(k["end_ns"] for k in r) - r[0]["start_ns"] for r in reps]
    by_node = collections.defaultdict(lambda: {"exp": [], "idle": [], "dur": []})
    order = []
    for r in reps:
        for k, (exp, idle) in zip(r, critical(r)):
            node = by_node[k["graph_node"]]
            if not node["exp"]:
                order.append(k["graph_node"])
                node["name"] = k["name"]
                node["grid"] = k["grid"]
            node["exp"].append(exp)
            node["idle"].append(idle)
            node["dur"].append(k["end_ns"] - k["start_ns"])
    med = statistics.median
    print(f"\ngraph {gid}: {len(reps)} replays of {n_nodes} kernels, span median {med(spans) / 1e3:.1f} us "
          f"(min {min(spans) / 1e3:.1f}, max {max(spans) / 1e3:.1f})")
    fam = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for n in order:
        v = by_node[n]
        f = fam[v["name"]]
        f[0] += 1
        f[1] += med(v["exp"])
        f[2] += med(v["dur"])
        f[3] += med(v["idle"])
    total = sum(f[1] + f[3] for f in fam.values())
    print(f"  {'kernel':<44} {'n':>4} {'exposed us':>11} {'share':>6} {'duration us':>12} {'idle us':>8}")
    for name, f in sorted(fam.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name[-44:]:<44} {f[0]:>4} {f[1] / 1e3:>11.1f} {100 * f[1] / total:>5.1f}% {f[2] / 1e3:>12.1f} "
              f"{f[3] / 1e3:>8.1f}")
    print(f"  {'(sum of medians)':<44} {'':>4} {sum(f[1] for f in fam.values()) / 1e3:>11.1f} {'':>6} "
          f"{sum(f[2] for f in fam.values()) / 1e3:>12.1f} {sum(f[3] for f in fam.values()) / 1e3:>8.1f}")
    if show_nodes:
        print(f"  nodes in order: {'kernel':<40} {'grid':>6} {'exposed':>8} {'dur':>8} {'idle':>6}")
        for n in order:
            v = by_node[n]
            print(f"  {v['name'][-56:]:<56} {v['grid']:>6} {med(v['exp']) / 1e3:>8.2f} {med(v['dur']) / 1e3:>8.2f} "
                  f"{med(v['idle']) / 1e3:>6.2f}")


def between(gid, reps, rows):
    """What runs between a graph's replays (the step's tail and the host's gap): offsets from the replay's end."""
    starts = [min(k["start_ns"] for k in r) for r in reps]
    ends = [max(k["end_ns"] for k in r) for r in reps]
    others = sorted((r for r in rows if r["graph_id"] != gid), key=lambda r: r["start_ns"])
    seqs = []
    j = 0
    for e, nxt in zip(ends, starts[1:]):
        while j < len(others) and others[j]["start_ns"] < e:
            j += 1
        seq = []
        while j < len(others) and others[j]["start_ns"] < nxt:
            seq.append(others[j])
            j += 1
        seqs.append(seq)
    n_items = usual(seqs)[1]
    same = [(e, nxt, seq) for e, nxt, seq in zip(ends, starts[1:], seqs) if len(seq) == n_items]
    med = statistics.median
    print(f"\ngraph {gid}: between replays (median of {len(same)} gaps with {n_items} items): replay end to next "
          f"start {med([n - e for e, n, _ in same]) / 1e3:.1f} us")
    for i in range(n_items):
        st = [s[i]["start_ns"] - e for e, _, s in same]
        du = [s[i]["end_ns"] - s[i]["start_ns"] for _, _, s in same]
        k = same[0][2][i]
        print(f"  +{med(st) / 1e3:>8.1f} us  {med(du) / 1e3:>7.1f} us  stream {k['stream']:>3}  {k['name'][-50:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--graph", type=int, help="only this graph id")
    ap.add_argument("--nodes", action="store_true", help="also list every kernel of a replay in order")
    ap.add_argument("--between", action="store_true", help="also list what runs between a graph's replays")
    ap.add_argument("--min-replays", type=int, default=5)
    a = ap.parse_args()
    rows = load(a.csv)
    graphs = collections.defaultdict(list)
    loose = collections.defaultdict(lambda: [0, 0])
    for r in rows:
        if r["graph_id"]:
            graphs[r["graph_id"]].append(r)
        else:
            loose[r["name"]][0] += 1
            loose[r["name"]][1] += r["end_ns"] - r["start_ns"]
    print(f"{len(rows)} kernels: {sum(len(v) for v in graphs.values())} in {len(graphs)} graphs")
    for gid, ks in sorted(graphs.items()):
        if a.graph is not None and gid != a.graph:
            continue
        reps = usual(replays(sorted(ks, key=lambda k: k["start_ns"])))[0]
        if len(reps) < a.min_replays:
            continue
        summarise_graph(gid, reps, a.nodes)
        if a.between:
            between(gid, reps, rows)
    if a.graph is None and loose:
        print("\nkernels outside graphs, by total duration:")
        for name, (n, ns) in sorted(loose.items(), key=lambda kv: -kv[1][1])[:25]:
            print(f"  {name[-60:]:<60} {n:>7} {ns / 1e6:>10.2f} ms")


if __name__ == "__main__":
    main()
