#!/usr/bin/env python3
"""Elastic-serving bench: starts `specserve up` with an autoscaled topology on loopback, sends a
bounded burst through the OpenAI-compatible HTTP API (streaming /v1/completions, so TTFT is seen
by the client), and records over time the replicas by lifecycle state, the head's queue and each
request's TTFT (from /metrics and the client), then the head's cold-start (process start
requested -> ready) and warm-promotion times (`specserve status --json`), each from the
autoscaler's decision: -> the replica routed, -> the first request sent to it, -> that request's
first token; and scale-ups that had to start a replica cold (decision -> first token).

Phases: IDLE_BEFORE s of no traffic, then NUM_REQUESTS requests from CONCURRENCY client threads
(the burst; bounded in count and by BURST_TIMEOUT s), then IDLE_AFTER s of no traffic (the pool
scales back). Every request must finish with max_tokens tokens; failures are counted and shown.

Command: bench/run_autoscale_bench.sh (it builds, picks the venv, then plots).
Writes OUT.json and OUT.md (OUT from --out).
"""
import argparse
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

PROMPTS = [
    "The history of the Roman Empire begins with",
    "A recipe for pancakes: first, take",
    "The three laws of motion state that",
    "In a small village by the sea there lived",
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle stays upright.",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


METRIC_RE = re.compile(r'^(specserve:[a-z_]+)(\{[^}]*\})? (\S+)$')


def scrape(base):
    """Replicas by state, queue and running from /metrics."""
    text = requests.get(base + "/metrics", timeout=5).text
    states, out = {}, {}
    for line in text.splitlines():
        m = METRIC_RE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "specserve:replica_state" and value == 1.0:
            st = re.search(r'state="([a-z]+)"', labels).group(1)
            states[st] = states.get(st, 0) + 1
        elif name in ("specserve:num_requests_waiting", "specserve:num_requests_running",
                      "specserve:autoscaler_target_replicas"):
            out[name.split(":")[1]] = value
    for st in ("starting", "loading", "warming", "ready", "draining", "standby", "stopped"):
        out[st] = states.get(st, 0)
    return out


def one_request(base, model, i, max_tokens, t0):
    body = {"model": model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True}
    start = time.monotonic()
    rec = {"i": i, "submit_s": start - t0, "ok": False, "ttft_s": None, "e2e_s": None, "tokens": 0, "error": ""}
    try:
        with requests.post(base + "/v1/completions", json=body, stream=True, timeout=300) as r:
            if r.status_code != 200:
                rec["error"] = f"HTTP {r.status_code}: {r.text[:200]}"
                return rec
            finish = None
            for line in r.iter_lines():
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    rec["error"] = str(chunk["error"])
                    return rec
                ch = chunk["choices"][0]
                if ch.get("text") and rec["ttft_s"] is None:
                    rec["ttft_s"] = time.monotonic() - start
                if ch.get("text"):
                    rec["tokens"] += 1  # one chunk per step; counted exactly from usage below when present
                finish = ch.get("finish_reason") or finish
            rec["e2e_s"] = time.monotonic() - start
            rec["finish_reason"] = finish
            rec["ok"] = finish == "length"
            if not rec["ok"]:
                rec["error"] = f"finish_reason {finish}"
    except Exception as e:  # noqa: BLE001 - a failed request is a result, not a crash
        rec["error"] = repr(e)
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, help="output prefix (OUT.json, OUT.md)")
    ap.add_argument("--num-requests", type=int, default=int(os.environ.get("NUM_REQUESTS", 48)))
    ap.add_argument("--concurrency", type=int, default=int(os.environ.get("CONCURRENCY", 12)))
    ap.add_argument("--max-tokens", type=int, default=int(os.environ.get("MAX_TOKENS", 32)))
    ap.add_argument("--idle-before", type=float, default=float(os.environ.get("IDLE_BEFORE", 4)))
    ap.add_argument("--idle-after", type=float, default=float(os.environ.get("IDLE_AFTER", 15)))
    ap.add_argument("--burst-timeout", type=float, default=float(os.environ.get("BURST_TIMEOUT", 240)))
    ap.add_argument("--threads-per-worker", type=int, default=1)
    ap.add_argument("--kv-cache-bytes", default=os.environ.get("KV_CACHE_BYTES", "24MiB"),
                    help="scheduler.kv_cache_bytes per replica (specserve's default is 1GiB; at least one sequence of --max-model-len: 24MiB holds 544 tokens of the default model)")
    ap.add_argument("--max-model-len", type=int, default=int(os.environ.get("MAX_MODEL_LEN", 512)),
                    help="models.target.max_model_len (0: the model's own, specserve's default)")
    ap.add_argument("--bursts", type=int, default=int(os.environ.get("BURSTS", 1)),
                    help="burst + idle cycles (each idle returns to min_replicas: one more promotion sample)")
    ap.add_argument("--max-num-seqs", type=int, default=int(os.environ.get("MAX_NUM_SEQS", 2)),
                    help="each replica's batch (scheduler.max_num_seqs; specserve's default is 64)")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="specserve_autoscale_bench_")
    actor_port, http_port = free_port(), free_port()
    autoscale = {"min_replicas": 1, "max_replicas": 3, "warm_pool": 1, "upscale_delay_s": 1, "downscale_delay_s": 3,
                 "target_ongoing_requests": 2}
    topo = f"""cluster: {{ name: autoscale-bench, token_file: {work}/token }}
head: {{ host: 127.0.0.1, actor_port: {actor_port}, http_port: {http_port} }}
models:
  target: {{ path: {args.model}{", max_model_len: " + str(args.max_model_len) if args.max_model_len else ""} }}
nodes:
  - name: n0
    host: 127.0.0.1
    devices: [cpu]
    workers:
      - {{ role: target_shard, replica: 0, device: cpu }}
      - {{ role: target_shard, replica: 1, device: cpu }}
      - {{ role: target_shard, replica: 2, device: cpu }}
scheduler: {{ max_num_seqs: {args.max_num_seqs}, kv_cache_bytes: {args.kv_cache_bytes} }}
autoscale: {json.dumps(autoscale).replace('"', '')}
"""
    config = os.path.join(work, "cluster.yaml")
    with open(config, "w") as f:
        f.write(topo)
    ready_file = os.path.join(work, "ready")
    log = open(os.path.join(work, "up.log"), "w")
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    up = subprocess.Popen([args.bin, "up", config, "--ready-file", ready_file, "--threads-per-worker",
                           str(args.threads_per_worker), "--drain-timeout", "30"], stdout=log, stderr=log, env=env)
    base = f"http://127.0.0.1:{http_port}"
    try:
        t_launch = time.monotonic()
        while not os.path.exists(ready_file):
            if up.poll() is not None:
                sys.exit(f"specserve up exited with {up.returncode}; log in {log.name}")
            if time.monotonic() - t_launch > 180:
                sys.exit("specserve up not ready within 180 s")
            time.sleep(0.1)
        model = requests.get(base + "/v1/models", timeout=5).json()["data"][0]["id"]
        t0 = time.monotonic()
        trace, stop = [], threading.Event()

        def poll():
            while not stop.is_set():
                try:
                    row = scrape(base)
                    row["t"] = time.monotonic() - t0
                    trace.append(row)
                except Exception:  # noqa: BLE001 - a missed sample is a gap in the plot
                    pass
                stop.wait(0.2)

        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(args.idle_before)
        results, bursts = [], []
        for b in range(args.bursts):
            start = time.monotonic() - t0
            print(f"[autoscale-bench] burst {b + 1}/{args.bursts}: {args.num_requests} requests", file=sys.stderr)
            with ThreadPoolExecutor(args.concurrency) as pool:
                futs = [pool.submit(one_request, base, model, b * args.num_requests + i, args.max_tokens, t0)
                        for i in range(args.num_requests)]
                results += [f.result(timeout=args.burst_timeout) for f in futs]
            bursts.append({"start_s": start, "end_s": time.monotonic() - t0})
            time.sleep(args.idle_after)
        t_burst, t_burst_end = bursts[0]["start_s"], bursts[-1]["end_s"]
        stop.set()
        poller.join()
        status = json.loads(subprocess.run([args.bin, "status", "--config", config, "--json"], capture_output=True,
                                           text=True, check=True).stdout)
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
        log.close()

    a = status["autoscale"]
    ok = [r for r in results if r["ok"]]
    ttfts = sorted(r["ttft_s"] for r in ok if r["ttft_s"] is not None)

    def pct(v, p):
        return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else None

    out = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "config": {"autoscale": autoscale, "num_requests": args.num_requests, "concurrency": args.concurrency,
                   "max_tokens": args.max_tokens, "idle_before_s": args.idle_before, "idle_after_s": args.idle_after,
                   "threads_per_worker": args.threads_per_worker, "model": os.path.basename(args.model),
                   "max_num_seqs": args.max_num_seqs, "bursts": args.bursts,
                   "max_model_len": args.max_model_len or "model's", "kv_cache_bytes": args.kv_cache_bytes},
        "burst": {"start_s": t_burst, "end_s": t_burst_end},
        "bursts": bursts,
        "requests": results,
        "trace": trace,
        "summary": {
            "requests_ok": len(ok), "requests_failed": len(results) - len(ok),
            "max_ready": max((r["ready"] for r in trace), default=0),
            "final_ready": trace[-1]["ready"] if trace else None,
            "final_standby": trace[-1]["standby"] if trace else None,
            "ttft_p50_s": pct(ttfts, 50), "ttft_p90_s": pct(ttfts, 90), "ttft_max_s": ttfts[-1] if ttfts else None,
            "num_promotions": a["num_promotions"], "num_cold_starts": a["num_cold_starts"], "num_drains": a["num_drains"],
            "num_stops": a["num_stops"],
            "cold_start_seconds": a["cold_start_seconds"],
            "promotion_routable_seconds": a.get("promotion_routable_seconds", []),
            "promotion_dispatch_seconds": a.get("promotion_dispatch_seconds", []),
            "promotion_seconds": a["promotion_seconds"],
            "cold_scale_up_seconds": a.get("cold_scale_up_seconds", []),
            "migrated": status.get("migrated", 0),
        },
        "status": status,
    }
    with open(args.out + ".json", "w") as f:
        json.dump(out, f, indent=1)
    s = out["summary"]
    cs, ps = s["cold_start_seconds"], s["promotion_seconds"]
    pr, pd, cu = s["promotion_routable_seconds"], s["promotion_dispatch_seconds"], s["cold_scale_up_seconds"]

    def each(v, digits=3):
        return ", ".join(f"{x:.{digits}f}" for x in v) or "-"

    md = [
        f"# Autoscaling on loopback — {time.strftime('%Y-%m-%d')}",
        "",
        f"Command: `bench/run_autoscale_bench.sh` (source {os.environ.get('SOURCE_COMMIT', '?')}). Machine: "
        f"{os.cpu_count()} CPUs ({platform.platform()}), shared with other work.",
        f"Topology: 3 declared replicas of {out['config']['model']} (one target_shard process each, "
        f"{args.threads_per_worker} thread, max_num_seqs {args.max_num_seqs}, max_model_len "
        f"{args.max_model_len or 'the model' + chr(39) + 's'}, kv_cache_bytes {args.kv_cache_bytes}"
        + ("" if args.kv_cache_bytes == "1GiB" else ": a smaller KV cache than the 1GiB default, so cold starts here are "
           "shorter than with defaults") + f"), plain decoding; autoscale {autoscale}.",
        f"Load: {args.idle_before:g} s idle, then {args.num_requests} streaming /v1/completions requests "
        f"(max_tokens {args.max_tokens}, greedy) from {args.concurrency} client threads, then {args.idle_after:g} s idle"
        + (f"; {args.bursts} times." if args.bursts > 1 else "."),
        "",
        "| | value |",
        "|---|---|",
        f"| requests ok / failed | {s['requests_ok']} / {s['requests_failed']} |",
        f"| ready replicas: max during the burst / at the end | {s['max_ready']} / {s['final_ready']} "
        f"(standby at the end: {s['final_standby']}) |",
        f"| promotions / cold starts / drains / stops | {s['num_promotions']} / {s['num_cold_starts']} / "
        f"{s['num_drains']} / {s['num_stops']} |",
        f"| TTFT p50 / p90 / max (client, s) | {s['ttft_p50_s']:.3f} / {s['ttft_p90_s']:.3f} / {s['ttft_max_s']:.3f} |"
        if ttfts else "| TTFT | none |",
        "",
        "Cold start (process start requested -> loaded, warmed up, ready) versus warm promotion, as the head "
        "measured them. A promotion is timed from the autoscaler's decision to the replica being routed (a state "
        "flip in the head), to the first request sent to it (queued at the head, or handed back by a busy "
        "replica's engine), and to that request's first token (one prefill forward pass on the promoted "
        "replica, plus the message hops). A scale-up that found no standby replica started one cold: its "
        "decision -> first token is listed apart.",
        "",
        "| | n | each (s) |",
        "|---|---|---|",
        f"| cold start: process start -> ready | {len(cs)} | {each(cs)} |",
        f"| warm promotion: decision -> routed | {len(pr)} | {each(pr, 6)} |",
        f"| warm promotion: decision -> first request sent | {len(pd)} | {each(pd, 6)} |",
        f"| warm promotion: decision -> first token | {len(ps)} | {each(ps)} |",
        f"| scale-up by cold start: decision -> first token | {len(cu)} | {each(cu)} |",
        "",
        f"Requests moved between replicas with their state (drains, hand-backs to a promoted replica): "
        f"{s['migrated']}.",
        "",
        f"![replicas, queue and TTFT over time]({os.path.basename(args.out)}.png)",
        "",
    ]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    if s["requests_failed"]:
        for r in results:
            if not r["ok"]:
                print(f"request {r['i']} failed: {r['error']}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
