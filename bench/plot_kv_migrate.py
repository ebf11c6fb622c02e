#!/usr/bin/env python3
"""Turns `specserve bench-migrate` results into OUT.json and OUT.md (per transport: KV bytes,
export / transfer / import ms, the first decode step after the import, re-prefilling the same
tokens, speed-up to the next token) and plots OUT.png: one stacked bar per transport (export,
transfer, import, decode step) beside the re-prefill bar.

Command: $(scripts/venv.sh --with-plot) bench/plot_kv_migrate.py --result R.json --out OUT
"""
import argparse
import json
import platform
import subprocess

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


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
    ap.add_argument("--result", required=True, help="specserve bench-migrate --output JSON")
    ap.add_argument("--out", required=True, help="output path without extension")
    ap.add_argument("--before", default="")
    ap.add_argument("--after", default="")
    ap.add_argument("--command", default="bench/run_kv_migrate_bench.sh")
    args = ap.parse_args()

    with open(args.result) as f:
        res = json.load(f)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    doc = dict(res)
    doc.update({"command": args.command, "machine": {"cpu": cpu_name(), "host": platform.node()}, "commit": commit,
                "load_before": args.before, "load_after": args.after})
    with open(args.out + ".json", "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    rows = res["results"]
    day = args.out.rsplit("_", 1)[-1]
    md = [f"# KV migration vs re-prefill, {res['prompt_tokens']}-token sequence — {platform.node()}, {day}", "",
          f"Command: `{args.command}` (specserve {commit}); machine: {cpu_name()}.", "",
          f"Model `{res['model'].rsplit('/', 1)[-1]}` on the CPU backend ({res['threads']} threads per process), "
          f"context {res['max_model_len']}; greedy. Two processes on this host: the exporter prefilled the "
          f"{res['prompt_tokens']}-token prompt and produced its first token; the sequence then moves to the "
          "importer. Migrate = `Engine::export_sequence` + `export_kv_blocks` into a registered UCX region (exporter) "
          "+ the UCX get into the importer's registered region (`KvEndpoint::get`, pipelined) + `Engine::add_migrated` "
          "whose `load_kv` runs `import_kv_blocks`. Decode step = the importer's first step, which produces the "
          "next token; it equalled the uninterrupted run's token "
          f"({res['next_token']}) every time. Re-prefill = a fresh engine given the same request without KV "
          "(`add_migrated` with `num_cached` 0) until it emits that token. Speed-up = re-prefill / (migrate + "
          f"decode step). Medians of {res['repeats']} runs (a fresh engine each, warmed by a short request first, "
          "as workers are).", "",
          f"Before: `{args.before}`; after: `{args.after}`.", "",
          "| UCX_TLS | KV bytes (MiB) | export ms | transfer ms (MiB/s) | import ms | migrate ms | decode step ms | "
          "re-prefill ms | speed-up |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['transports']} | {r['bytes'] / 2**20:.1f} | {r['export_ms']:.1f} | "
                  f"{r['transfer_ms']:.1f} ({r['transfer_mib_per_s']:.0f}) | {r['import_ms']:.1f} | "
                  f"{r['migrate_ms']:.1f} | {r['decode_step_ms']:.1f} | {r['reprefill_ms']:.1f} | "
                  f"{r['speedup_to_next_token']:.1f}x |")
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    labels, parts = [], ["export_ms", "transfer_ms", "import_ms", "decode_step_ms"]
    names = ["export", "UCX get", "import", "decode step"]
    for i, r in enumerate(rows):
        bottom = 0.0
        for j, (p, n) in enumerate(zip(parts, names)):
            ax.bar(i, r[p], bottom=bottom, color=f"C{j}", label=n if i == 0 else None)
            bottom += r[p]
        ax.text(i, bottom, f"{bottom:.0f} ms", ha="center", va="bottom", fontsize=8)
        labels.append(f"migrate\n({r['transports']})")
    re_ms = rows[0]["reprefill_ms"] if rows else 0
    ax.bar(len(rows), re_ms, color="C7", label="re-prefill")
    ax.text(len(rows), re_ms, f"{re_ms:.0f} ms", ha="center", va="bottom", fontsize=8)
    labels.append("re-prefill")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=9)
    ax.set_ylabel("ms to the next token")
    ax.set_title(f"Moving a {res['prompt_tokens']}-token sequence between two processes "
                 f"({rows[0]['bytes'] / 2**20:.0f} MiB of KV)" if rows else "", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=110)
    print(args.out + ".png")


if __name__ == "__main__":
    main()
