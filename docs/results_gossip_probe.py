"""`coop simulate`, plus a probe on the gossip merge (nothing else changes; metrics.jsonl is the same).

After every gossip round it appends to OUT/consensus.jsonl: the consensus distance of the replicas'
copies of the global weights (coop.gossip.merge.consensus_distance), that distance relative to the
norm of their mean, and every PROBE_EVERY rounds (and the last) the val loss of each copy, on the
same eval windows as metrics.jsonl. It exists only because metrics.jsonl does not record the
consensus distance yet. Usage, from the repository root:

    PYTHONPATH=. python docs/results_gossip_probe.py simulate ARGS    # ARGS: those of `coop simulate`
"""
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

import coop.simulate as sim
from coop.cli import main
from coop.gossip.merge import consensus_distance

EVERY = int(os.environ.get("PROBE_EVERY", "3"))
state = {}
_build_setup, _merge = sim.build_setup, sim.GossipTopology.merge


def build_setup(cfg):
    state["setup"] = _build_setup(cfg)
    (Path(cfg.out) / "consensus.jsonl").write_text("")  # replaced, as metrics.jsonl is
    return state["setup"]


def merge(self, round_index, updates, tokens, sent):
    result = _merge(self, round_index, updates, tokens, sent)
    setup = state["setup"]
    cfg = setup.cfg
    copies = [self.bases[i] for i in sorted(self.joined)]
    mean_norm = math.sqrt(sum(float((np.mean([c[n] for c in copies], axis=0, dtype=np.float64) ** 2).sum())
                              for n in copies[0]))
    dist = consensus_distance(copies)
    record = {"run": f"gossip-{cfg.compression[0]}" + (f"-{cfg.tag}" if cfg.tag else ""), "round": round_index + 1,
              "consensus_distance": round(dist, 6), "relative": round(dist / mean_norm, 8)}
    if (round_index + 1) % EVERY == 0 or round_index + 1 == cfg.total_rounds:
        record["val_loss_by_replica"] = [round(sim.evaluate(setup, c), 6) for c in copies]
    with open(Path(cfg.out) / "consensus.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    return result


sim.runs.build_setup, sim.GossipTopology.merge = build_setup, merge  # where simulate() looks it up
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
