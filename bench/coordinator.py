"""Coordinator benchmark: round time, throughput and peak memory of a real coordinator process
(uvicorn + httptools + uvloop) on loopback, with N worker processes sending random updates of the
right shape for a GPT-2-small-sized model (124M parameters), for each codec.

    python bench/coordinator.py                       # 124M parameters, 8 workers, 3 rounds, fp32 and int8
    python bench/coordinator.py --small --rounds 2    # a quick check with a tiny model
    python bench/coordinator.py --ingest port api     # the upload port (updates in, weights out) against uvicorn's routes

One JSON object per line. Per round, every worker downloads the global weights, uploads one
encoded update and long-polls the end of the round; the coordinator decodes and aggregates each
update as it arrives (streaming, O(model) memory), takes the outer step and writes its checkpoint.

    round_s           median time between two round closes (downloads + uploads + aggregation + checkpoint)
    in_MBps           update bytes received per second of round
    in_out_MBps       update bytes received + weight bytes sent, per second of round
    close_s           the wait for the last checkpoint, the aggregation and the outer step, per round
    peak_rss_MB       the coordinator process's peak resident memory (VmHWM)
    peak_over_model   peak_rss_MB / fp32 model size: the O(model) claim as one number
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from coop.diloco import DEFAULT_RULE  # noqa: E402 (after the path)

GPT2_SMALL = {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "vocab_size": 50304}
TINY = {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64, "vocab_size": 512}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_config(model: dict, codec: str, workers: int, rounds: int, ram_mb: float | None = None,
               aggregation: str | None = None, concurrent_uploads: int | None = None) -> dict:
    return {
        "model": model,
        "data": {"default_chars": 400_000, "shards": workers},
        "inner": {"steps": 1, "batch_size": 1},
        "compression": {"codec": codec, "options": {"block_size": 256} if codec == "int8" else {}},
        "rounds": {"max_rounds": rounds, "min_workers": workers, "quorum_fraction": 1.0, "eval_every": 0,
                   "worker_timeout_s": 600, "heartbeat_s": 30, "max_deadline_s": 3600},
        "coordinator": {"ram_for_updates_mb": ram_mb, **({"aggregation": aggregation} if aggregation else {}),
                        **({"concurrent_uploads": concurrent_uploads} if concurrent_uploads else {})},
    }


def peak_rss_mb(pid: int, field: str = "VmHWM") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mb(pid: int) -> float:
    try:
        return peak_rss_mb(pid, "VmRSS")
    except OSError:
        return float("nan")


def bench(model: dict, codec: str, workers: int, rounds: int, ram_mb: float | None = None,
          aggregation: str | None = None, ingest: str = "port", concurrent_uploads: int | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="coop-bench-") as tmp:
        config_path = Path(tmp) / "run.json"
        config_path.write_text(json.dumps(run_config(model, codec, workers, rounds, ram_mb, aggregation,
                                                     concurrent_uploads)))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = open(Path(tmp) / "coordinator.log", "wb")
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "coop.coordinator.cli", "serve", "--config", str(config_path), "--state-dir",
             str(Path(tmp) / "state"), "--port", str(port), "--log-level", "warning",
             "--upload-port", str(free_port() if ingest == "port" else 0)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(url + "/v1/info", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if coordinator.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("coordinator did not start:\n" + (Path(tmp) / "coordinator.log").read_text()[-3000:])
                time.sleep(0.5)
            startup_rss = peak_rss_mb(coordinator.pid)
            samples: list[tuple[float, float]] = []  # (time, resident MB): where in the round the peak is
            sampling = threading.Event()

            def sample() -> None:
                while not sampling.wait(0.1):
                    samples.append((time.time(), rss_mb(coordinator.pid)))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            clients = [subprocess.Popen([sys.executable, __file__, "--_worker", url, "--_seed", str(i), "--codec", codec],
                                        cwd=REPO, stdout=subprocess.PIPE) for i in range(workers)]
            reports = []
            for client in clients:
                out, _ = client.communicate(timeout=3600)
                if client.returncode != 0:
                    raise SystemExit(f"a bench worker failed (exit {client.returncode})")
                reports.append(json.loads(out.decode().strip().splitlines()[-1]))
            status = httpx.get(url + "/v1/status", timeout=30).json()
            metrics = httpx.get(url + "/metrics", timeout=30).text
            peak = peak_rss_mb(coordinator.pid)
            sampling.set()
        finally:
            coordinator.terminate()
            coordinator.wait(60)
    history = [h for h in status["history"] if h.get("round") is not None]
    closes = [h["closed_at"] for h in history]
    peak_at, peak_sampled = max(samples, key=lambda s: s[1]) if samples else (float("nan"), float("nan"))
    # the sampled peak, in seconds from the nearest round close (negative: before it; the close itself
    # takes close_s before closed_at)
    peak_from_close = min((peak_at - c for c in closes), key=abs) if closes else float("nan")
    round_times = [b - a for a, b in zip(closes, closes[1:])]  # round 0 also holds start-up; left out
    round_s = statistics.median(round_times) if round_times else history[0]["duration_s"]
    bytes_in = statistics.median(h["bytes_in"] for h in history)
    weights_bytes = 4 * status["model"]["parameters"] + 100 * 200  # + the safetensors header, roughly
    close_sum = _metric(metrics, "coop_aggregate_seconds_sum")
    close_count = _metric(metrics, "coop_aggregate_seconds_count")
    model_mb = 4 * status["model"]["parameters"] / 1e6
    return {
        "bench": "coordinator",
        "codec": codec,
        "aggregation": aggregation or DEFAULT_RULE,
        "ingest": ingest,  # port: the upload port's threads (coop.coordinator.ingest); api: uvicorn's route
        "concurrent_uploads": concurrent_uploads,  # None: the config's default
        "ram_for_updates_mb": ram_mb,  # None: the default, half the memory available at start
        "parameters": status["model"]["parameters"],
        "workers": workers,
        "rounds": len(history),
        "update_MB": round(bytes_in / workers / 1e6, 1),
        "round_s": round(round_s, 2),
        "in_MBps": round(bytes_in / round_s / 1e6, 1),
        "in_out_MBps": round((bytes_in + workers * weights_bytes) / round_s / 1e6, 1),
        "close_s": round(close_sum / max(close_count, 1), 2),
        # the close's parts (the coordinator's history): the last checkpoint's write still going, the
        # aggregation with the outer step, packing the weights; and how long a checkpoint write takes
        "close_parts_s": {k: round(statistics.mean(h.get("close_parts_s", {}).get(k, 0.0) for h in history), 2)
                          for k in history[0].get("close_parts_s", {})},
        "checkpoint_write_s": (status.get("checkpoint") or {}).get("write_s"),
        "worker_upload_s": round(statistics.median(t for r in reports for t in r["upload_s"]), 2),
        "worker_download_s": round(statistics.median(t for r in reports for t in r["download_s"]), 2),
        "startup_rss_MB": round(startup_rss),
        "peak_rss_MB": round(peak),
        "model_MB": round(model_mb),
        "peak_over_model": round(peak / model_mb, 2),
        "peak_sampled_MB": round(peak_sampled),
        "peak_s_from_close": round(peak_from_close, 2),
        "cpus": os.cpu_count(),
    }


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


# -- the light worker (a child process) ------------------------------------------------------------


def bench_worker(url: str, seed: int, codec_name: str) -> None:
    from coop.codec import get_codec
    from coop.wire import pack_view, upload_chunks

    http = httpx.Client(base_url=url, timeout=httpx.Timeout(3600, connect=30))
    info = http.post("/v1/join", json={"name": f"bench{seed}"}).json()
    updates_to = f"http://127.0.0.1:{info['upload_port']}" if info.get("upload_port") else ""  # else the API's port
    weights_from = updates_to if info.get("weights_on_upload_port") else ""  # as real workers do
    auth = {"Authorization": f"Bearer {info['worker_token']}"}
    shapes: dict[str, list[int]] | None = None
    encoded = None
    timings = {"download_s": [], "upload_s": [], "wait_s": []}
    while True:
        t0 = time.perf_counter()
        with http.stream("GET", f"{weights_from}/v1/weights", headers=auth) as response:
            round_number = int(response.headers["X-Coop-Round"])
            head = bytearray()
            for chunk in response.iter_bytes(8 << 20):
                if shapes is None:
                    head += chunk
                    if len(head) >= 8 and len(head) >= 8 + struct.unpack("<Q", head[:8])[0]:
                        n = struct.unpack("<Q", head[:8])[0]
                        header = json.loads(bytes(head[8 : 8 + n]))
                        shapes = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
        timings["download_s"].append(time.perf_counter() - t0)
        state = http.post("/v1/heartbeat", headers=auth, json={}).json()
        if state["done"]:
            break
        if encoded is None:  # once: a random update of the right shape, encoded
            rng = np.random.default_rng(seed)
            update = {k: (rng.standard_normal(s, dtype=np.float32) * 1e-3) for k, s in shapes.items()}
            encoded = get_codec(codec_name, **info["compression"]["options"]).encode(update)
            del update
        body = pack_view(encoded.tensors, {**encoded.metadata, "round": round_number, "tokens": 1})  # as a worker packs
        t0 = time.perf_counter()
        response = http.put(f"{updates_to}/v1/rounds/{round_number}/update", content=upload_chunks(body),
                            headers={**auth, "Content-Length": str(body.nbytes), "Content-Type": "application/octet-stream"})
        timings["upload_s"].append(time.perf_counter() - t0)
        del body
        if response.status_code != 200:
            raise SystemExit(f"upload refused: {response.status_code} {response.text[:300]}")
        t0 = time.perf_counter()
        while not http.get(f"/v1/rounds/{round_number}/wait", params={"timeout_s": 60}, headers=auth).json()["closed"]:
            pass
        timings["wait_s"].append(time.perf_counter() - t0)
    print(json.dumps(timings))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--codecs", nargs="+", default=["fp32", "int8"])
    parser.add_argument("--small", action="store_true", help="a tiny model instead of 124M parameters")
    parser.add_argument("--ram-for-updates-mb", type=float, default=None,
                        help="[coordinator] ram_for_updates_mb: uploads and kept updates in RAM up to this, the rest "
                             "through the spool (0: all through the disk; default: half the available memory)")
    parser.add_argument("--aggregation", help="[coordinator] aggregation: the merge's rule (default: the run "
                        "config's, filtered_mean, which keeps every update until the close; mean streams them)")
    parser.add_argument("--ingest", nargs="+", choices=["port", "api"], default=["port"],
                        help="where updates arrive and the weights are served: port, the coordinator's upload "
                             "port (the default); api, uvicorn's routes (--upload-port 0); both to compare")
    parser.add_argument("--concurrent-uploads", type=int, help="[coordinator] concurrent_uploads: uploads decoded "
                        "at once (default: the config's, 2)")
    parser.add_argument("--codec", default="fp32", help=argparse.SUPPRESS)
    parser.add_argument("--_worker", help=argparse.SUPPRESS)
    parser.add_argument("--_seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker:
        bench_worker(args._worker, args._seed, args.codec)
        return
    for codec in args.codecs:
        for ingest in args.ingest:
            print(json.dumps(bench(TINY if args.small else GPT2_SMALL, codec, args.workers, args.rounds,
                                   ram_mb=args.ram_for_updates_mb, aggregation=args.aggregation, ingest=ingest,
                                   concurrent_uploads=args.concurrent_uploads)),
                  flush=True)


if __name__ == "__main__":
    main()
