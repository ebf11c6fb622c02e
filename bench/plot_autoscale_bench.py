#!/usr/bin/env python3
"""Plots bench/autoscale_loadgen.py's JSON: replicas by state (ready, standby, starting) over
time, the head's queue and running requests, and each request's TTFT at its submission time,
with the burst shaded; cold-start and promotion times in the title.

Command: $(scripts/venv.sh --with-plot) bench/plot_autoscale_bench.py RESULT.json [-o OUT.png]
(default OUT: the input with .png).
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("result")
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    d = json.load(open(args.result))
    out = args.output or args.result.rsplit(".", 1)[0] + ".png"
    tr = d["trace"]
    t = [r["t"] for r in tr]
    fig, ax = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    starting = [r["starting"] + r["loading"] + r["warming"] for r in tr]
    ax[0].step(t, [r["ready"] for r in tr], where="post", label="ready (routed)", lw=2)
    ax[0].step(t, [r["standby"] for r in tr], where="post", label="standby (warm pool)")
    ax[0].step(t, starting, where="post", label="starting/loading/warming", ls="--")
    ax[0].step(t, [r["draining"] for r in tr], where="post", label="draining", ls=":")
    if tr and "autoscaler_target_replicas" in tr[0]:
        ax[0].step(t, [r.get("autoscaler_target_replicas", 0) for r in tr], where="post", label="target", color="grey",
                   alpha=0.5)
    ax[0].set_ylabel("replicas")
    ax[0].legend(loc="upper right", fontsize=8)
    ax[1].plot(t, [r.get("num_requests_waiting", 0) for r in tr], label="waiting (head + engines)")
    ax[1].plot(t, [r.get("num_requests_running", 0) for r in tr], label="running")
    ax[1].set_ylabel("requests")
    ax[1].legend(loc="upper right", fontsize=8)
    ok = [r for r in d["requests"] if r["ok"] and r["ttft_s"] is not None]
    ax[2].scatter([r["submit_s"] + r["ttft_s"] for r in ok], [r["ttft_s"] for r in ok], s=10)
    ax[2].set_ylabel("TTFT (s), at first token")
    ax[2].set_xlabel("seconds")
    for a in ax:
        for b in d.get("bursts", [d["burst"]]):
            a.axvspan(b["start_s"], b["end_s"], color="orange", alpha=0.12)
    s = d["summary"]
    cs = s["cold_start_seconds"]
    ps = s["promotion_seconds"]
    fmt = lambda v: ", ".join(f"{x:.2f}" for x in v) or "-"  # noqa: E731
    fig.suptitle(f"Autoscaling 1..3 replicas, warm pool 1: {s['requests_ok']} ok / {s['requests_failed']} failed\n"
                 f"cold start (s): {fmt(cs)}   |   warm promotion, decision -> first token (s): {fmt(ps)}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
