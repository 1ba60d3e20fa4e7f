"""`coop simulate`: N DiLoCo replicas in one process, against the ddp / single baselines, on one
token budget (what a run does, as `coop simulate -h` says it: cli.DESCRIPTION).

    config.py     SimulateConfig: every option of an invocation
    setup.py      what the runs share: data, shards, the initial model, the eval windows
    transport.py  the in-process transport and the merges (star, gossip)
    runs.py       the runs: DiLoCo through coop.round.RoundLoop, the ddp / single baselines
    report.py     metrics.jsonl, the plot and the summary table
    cli.py        the command line
"""
from . import runs
from .cli import add_parser, run
from .config import SimulateConfig, codec_for
from .runs import DataParallelReplica, RunResult, run_baseline, run_diloco, simulate
from .setup import Setup, build_setup, copy_weights, data_seed, evaluate, inner_config, new_replica, outer_optimizer
from .transport import TOPOLOGIES, GossipTopology, InProcessTransport, StarTopology

__all__ = ["runs", "SimulateConfig", "Setup", "RunResult", "build_setup", "simulate", "run_diloco", "run_baseline",
           "add_parser", "run", "codec_for", "copy_weights", "data_seed", "evaluate", "inner_config", "new_replica",
           "outer_optimizer", "DataParallelReplica", "TOPOLOGIES", "StarTopology", "GossipTopology",
           "InProcessTransport"]
