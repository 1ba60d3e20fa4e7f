"""What every coop server's /metrics has besides its own figures (the coordinator's:
`coop.coordinator.metrics`; a peer's: `coop.gossip.metrics`): the process metrics that Prometheus'
client libraries export everywhere (`process_resident_memory_bytes`, `process_cpu_seconds_total`,
`process_start_time_seconds`, `process_open_fds`, ... read from /proc, so only where there is one)
and `coop_build_info{version, cuda, python} 1`.

Names follow Prometheus' conventions: base units in the name (`_bytes`, `_seconds`), counters end
in `_total` (prometheus_client appends it to a Counter's name).
"""
from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

import engine.cuda
from coop import __version__

CONTENT_TYPE = CONTENT_TYPE_LATEST


def build_labels() -> dict[str, str]:
    """The build_info labels: coop's version, the CUDA version engine was built with ("none": a
    CPU-only build) and Python's version."""
    info = engine.cuda.build_info()
    cuda = (info.get("cuda_version") or "unknown") if info.get("cuda_built") else "none"
    return {"version": __version__, "cuda": cuda, "python": platform.python_version()}


def server_registry() -> CollectorRegistry:
    """A registry of its own (several servers may live in one process, as in the tests) with the
    process metrics and the build info already in it."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    labels = build_labels()
    Gauge("coop_build_info", "The coop build serving these metrics (always 1)", list(labels),
          registry=registry).labels(**labels).set(1)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition format of everything in `registry`."""
    return generate_latest(registry)
