#!/usr/bin/env python3
"""Combines `specserve bench-kv-transfer` results with ucx_perftest's on the same transports into
OUT.json and OUT.md (bandwidth and the ratio ours / ucx_perftest per transport, op and size), and
plots OUT.png: bandwidth against transfer size, one panel per op, solid lines ours, dashed
ucx_perftest, one colour per transport.

Input --perftest: lines "TRANSPORT OP BYTES ITERS P50_US AVG_US OVERALL_US AVG_MBS OVERALL_MBS
AVG_MR OVERALL_MR" (ucx_perftest's final row, MB = 2^20 bytes), as bench/run_kv_transfer_bench.sh
writes them.

Command: $(scripts/venv.sh --with-plot) bench/plot_kv_transfer.py --ours A.json... --perftest P.txt --out OUT
"""
import argparse
import json
import platform
import subprocess

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

AIM = 0.7  # the aim: at least 70% of ucx_perftest


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours", nargs="+", required=True)
    ap.add_argument("--perftest", required=True)
    ap.add_argument("--out", required=True, help="output path without extension")
    ap.add_argument("--before", default="")
    ap.add_argument("--after", default="")
    ap.add_argument("--command", default="bench/run_kv_transfer_bench.sh")
    ap.add_argument("--perftest-commands", help="lines 'TRANSPORT OP BYTES ucx_perftest ARGS...'")
    args = ap.parse_args()

    ours = {}
    for path in args.ours:
        with open(path) as f:
            for r in json.load(f)["results"]:
                ours[(r["transports"], r["op"], r["size_bytes"])] = r
    perf = {}
    with open(args.perftest) as f:
        for line in f:
            w = line.split()
            if len(w) != 11:
                continue
            perf[(w[0], w[1], int(w[2]))] = {"iterations": int(w[3]), "overall_latency_us": float(w[6]),
                                             "mib_per_s": float(w[8])}
    commands = {}
    if args.perftest_commands:
        with open(args.perftest_commands) as f:
            for line in f:
                w = line.split(None, 3)
                if len(w) == 4:
                    commands[(w[0], w[1], int(w[2]))] = w[3].strip()
    rows = []
    for key in sorted(ours, key=lambda k: (k[0], k[1], k[2])):
        o = ours[key]
        p = perf.get(key)
        rows.append({"transports": key[0], "op": key[1], "size_bytes": key[2],
                     "ours_mib_per_s": o["mib_per_s"], "ours_runs_mib_per_s": o.get("mib_per_s_runs", []),
                     "ours_iterations": o["iterations"],
                     "ucx_perftest_mib_per_s": p["mib_per_s"] if p else None,
                     "ucx_perftest_iterations": p["iterations"] if p else None,
                     "ucx_perftest_command": commands.get(key),
                     "ratio": (o["mib_per_s"] / p["mib_per_s"]) if p and p["mib_per_s"] > 0 else None})
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    doc = {"command": args.command, "machine": {"cpu": cpu_name(), "host": platform.node()}, "commit": commit,
           "load_before": args.before, "load_after": args.after, "aim_ratio": AIM, "results": rows}
    with open(args.out + ".json", "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    day = args.out.rsplit("_", 1)[-1]
    r0 = next(iter(ours.values()), {})
    chunk = (f"{r0['chunk_bytes'] >> 10} KiB, up to {r0['max_in_flight']}" if "chunk_bytes" in r0
             else "(not recorded)")
    md = [f"# KV block transfer bandwidth vs ucx_perftest — {platform.node()}, {day}", "",
          f"Command: `{args.command}` (specserve {commit}); machine: {cpu_name()}.", "",
          "Two processes on this host. Ours: `specserve bench-kv-transfer` (one "
          "`KvEndpoint::get` / `put` (+ flush) call per transfer into registered memory, each call pipelined "
          f"as chunks of {chunk} in flight; best of 3 runs). UCX's: "
          "`ucx_perftest -t ucp_put_bw | ucp_get -z` (server and client on 127.0.0.1, overall "
          "bandwidth; `-e` peer error handling where UCX allows it, as our endpoints: not on `sm` "
          "alone in UCX 1.13; exact commands in the JSON). MiB/s = 2^20 bytes per second. "
          "Aim: ratio >= 0.7.", "",
          f"Before: `{args.before}`; after: `{args.after}`.", "",
          "| UCX_TLS | op | size (MiB) | ours (MiB/s) | ucx_perftest (MiB/s) | ours / ucx_perftest |",
          "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "n/a"
        if r["ratio"] is not None and r["ratio"] < AIM:
            ratio += " (below aim)"
        pt = f"{r['ucx_perftest_mib_per_s']:.0f}" if r["ucx_perftest_mib_per_s"] is not None else "n/a"
        md.append(f"| {r['transports']} | {r['op']} | {r['size_bytes'] >> 20} | {r['ours_mib_per_s']:.0f} | {pt} | {ratio} |")
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")

    ops = sorted({r["op"] for r in rows})
    fig, axes = plt.subplots(1, len(ops), figsize=(5.5 * len(ops), 4.2), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for i, tls in enumerate(sorted({r["transports"] for r in rows})):
            sel = [r for r in rows if r["op"] == op and r["transports"] == tls]
            xs = [r["size_bytes"] >> 20 for r in sel]
            ax.plot(xs, [r["ours_mib_per_s"] for r in sel], marker="o", color=f"C{i}", label=f"specserve, {tls}")
            pts = [(x, r["ucx_perftest_mib_per_s"]) for x, r in zip(xs, sel) if r["ucx_perftest_mib_per_s"]]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="s", linestyle="--", color=f"C{i}",
                        label=f"ucx_perftest, {tls}")
        ax.set_xscale("log", base=2)
        sizes = sorted({r["size_bytes"] >> 20 for r in rows})
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(s) for s in sizes])
        ax.set_xlabel("transfer size (MiB)")
        ax.set_ylabel("MiB/s")
        ax.set_title(f"{op}", fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("KV block transfer over UCX between two processes: specserve vs ucx_perftest", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=110)
    print(args.out + ".png")


if __name__ == "__main__":
    main()
