"""The HTTP coordinator's close in process: `Aggregator.result()` of N fp32 updates of a GPT-2-small
sized model (124M parameters), the default rule (filtered_mean) unless told otherwise.

    python bench/robust_close.py                          # 8 x 124M, in RAM, filtered_mean
    python bench/robust_close.py --spooled --rule median  # through the spool (coop.spool)

One JSON line per case. close_s is the median of `--repeat` closes with the CPU kernels of
csrc/cpu/robust.cpp; numpy_close_s the same close with them switched off (coop.robust's numpy
fallback, what runs where engine._C is missing or older), and speedup their ratio: the two figures
come from the same run on the same machine, as absolute times on shared machines drift.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coop import robust  # noqa: E402
from coop.diloco import RULES, Aggregator  # noqa: E402
from coop.spool import Spool  # noqa: E402


def close_seconds(aggregator: Aggregator, out: np.ndarray, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        aggregator.result(out=out)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--params", type=int, default=124_439_808, help="coordinates per update (GPT-2 small)")
    parser.add_argument("--rule", choices=[r for r in RULES if r != "mean"], default="filtered_mean")
    parser.add_argument("--spooled", action="store_true", help="every update in the spool (on disk, page cache)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-numpy", action="store_true", help="skip the numpy fallback's close")
    args = parser.parse_args()
    shapes = {"wte": (args.params // 2,), "rest": (args.params - args.params // 2,)}
    with tempfile.TemporaryDirectory(prefix="robust-close-") as directory:
        aggregator = Aggregator(shapes, rule=args.rule, spool=Spool(directory) if args.spooled else None)
        rng = np.random.default_rng(0)
        common = {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes.items()}
        for i in range(args.workers):  # what the workers agree on, plus noise of their own
            update = {name: c + rng.standard_normal(c.shape, dtype=np.float32) for name, c in common.items()}
            aggregator.add(update, weight=1000.0 + i)
            del update
        del common
        out = np.empty(args.params, np.float32)
        native = robust.native_kernels()
        close_s = close_seconds(aggregator, out, args.repeat)
        record = {"workers": args.workers, "params": args.params, "rule": args.rule, "spooled": args.spooled,
                  "native": native, "cores": os.cpu_count(), "chunk": robust.NATIVE_CHUNK if native else robust.CHUNK,
                  "close_s": round(close_s, 3), "left_out": aggregator.left_out}
        if native and not args.no_numpy:
            fast = out.copy()
            robust.native = None  # the numpy fallback, as where engine._C lacks the kernels
            record["numpy_close_s"] = round(close_seconds(aggregator, out, args.repeat), 3)
            record["speedup"] = round(record["numpy_close_s"] / close_s, 2)
            record["same_bits"] = bool(np.array_equal(fast, out))
        aggregator.reset()
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
