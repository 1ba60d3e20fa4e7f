"""The run config (coop.runconfig): one file for both modes; TOML, YAML and JSON; clear errors;
the older coordinator and swarm layouts still read."""
import json

import pytest

from coop.runconfig import (
    EXAMPLE_TOML,
    ConfigError,
    RunConfig,
    load_run_config,
    parse_run_config,
)

# One tiny run, written once, read by the coordinator and by a swarm's first peer.
TINY_TOML = """
seed = 1
[model]
n_layer = 1
n_head = 2
n_embd = 16
block_size = 16
[data]
default_chars = 20000
shards = 2
[inner]
steps = 2
batch_size = 4
[compression]
codec = "int8"
[rounds]
max_rounds = 3
eval_batches = 2
[coordinator]
min_workers = 2
quorum_fraction = 1.0
[gossip]
group_size = 3
exchange_timeout_s = 5
"""


def test_example_config_parses_and_has_the_defaults(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(EXAMPLE_TOML)
    config = load_run_config(path)
    # the best settings of docs/results.md's sweep: K = 20, int4 (block 64), outer lr 0.5
    assert config.compression.codec == "int4" and config.compression.options == {"block_size": 64}
    assert config.outer.lr == 0.5 and config.outer.momentum == 0.9 and config.inner.inner_steps == 20
    assert config.inner_total_steps() == config.rounds.max_rounds * config.inner.inner_steps
    assert config.coordinator == RunConfig().coordinator and config.gossip == RunConfig().gossip


def test_one_file_serves_the_coordinator_and_a_swarm(tmp_path):
    from coop.coordinator.service import Coordinator
    from coop.gossip.peer import PeerNode

    path = tmp_path / "run.toml"
    path.write_text(TINY_TOML)
    config = load_run_config(path)
    coordinator = Coordinator(config, tmp_path / "state")
    peer = PeerNode(token=None, advertise="http://127.0.0.1:1", quiet=True)
    peer.setup_new_swarm(config)
    # the same model, optimizers, codec and K on both sides; each reads its own section
    assert {n: s.shape for n, s in peer.spec.items()} == coordinator.shapes
    assert coordinator.machine.max_rounds == 3 and coordinator.machine.min_workers == 2
    assert peer.config.gossip.group_size == 3 and peer.update_limit() > 0
    assert peer.replica.inner.total_steps == 6 == coordinator.join("w", "cpu")["inner"]["total_steps"]
    assert peer.config.codec().name == "int8"


def test_yaml_and_json(tmp_path):
    (tmp_path / "run.yaml").write_text("model:\n  n_layer: 2\ninner:\n  steps: 7\ngossip:\n  group_size: 4\n")
    config = load_run_config(tmp_path / "run.yaml")
    assert config.inner.inner_steps == 7 and config.gossip.group_size == 4
    (tmp_path / "run.json").write_text(json.dumps({"rounds": {"max_rounds": 3}, "coordinator": {"min_workers": 2}}))
    assert load_run_config(tmp_path / "run.json").coordinator.min_workers == 2


@pytest.mark.parametrize("raw, message", [
    ({"model": {"n_embd": 30, "n_head": 4}}, "divisible"),
    ({"rounds": {"max_roundz": 3}}, "rounds.max_roundz"),
    ({"compression": {"codec": "int8", "options": {"block_size": 0}}}, "block_size"),
    ({"compression": {"codec": "zip"}}, "compression.codec"),
    ({"coordinator": {"min_deadline_s": 10, "max_deadline_s": 5}}, "min_deadline_s"),
    ({"coordinator": {"heartbeat_s": 60, "worker_timeout_s": 30}}, "heartbeat_s"),
    ({"gossip": {"heartbeat_s": 5, "dead_after_s": 2}}, "dead_after_s"),
    ({"gossip": {"group_size": 1}}, "gossip.group_size"),
    ({"gossip": {"quorum_fraction": 0.5}}, "gossip.quorum_fraction"),
    ({"outer": {"momentum": 0.0}}, "nesterov"),
    ({"inner_steps": 5, "inner": {"steps": 6}}, "inner_steps .* and inner.steps are both given"),
    ([1, 2], "top level"),
])
def test_invalid_configs_say_where_and_why(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_run_config(raw)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="no run config"):
        load_run_config(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("[model\n")
    with pytest.raises(ConfigError, match="could not be parsed"):
        load_run_config(tmp_path / "bad.toml")
    (tmp_path / "run.ini").write_text("")
    with pytest.raises(ConfigError, match="unknown config format"):
        load_run_config(tmp_path / "run.ini")


def test_older_layouts_still_read():
    coordinator_style = {"rounds": {"max_rounds": 5, "min_workers": 3, "heartbeat_s": 2, "worker_timeout_s": 9},
                         "aggregation": {"max_norm": 4.0}, "limits": {"concurrent_uploads": 3}}
    config = parse_run_config(coordinator_style)
    assert config.rounds.max_rounds == 5 and config.coordinator.min_workers == 3
    assert config.coordinator.heartbeat_s == 2 and config.coordinator.max_norm == 4.0
    assert config.coordinator.concurrent_uploads == 3
    swarm_style = {"inner_steps": 7, "rounds": 9, "eval_every": 3, "data": {"default_corpus_chars": 50000},
                   "gossip": {"codec": "int8", "codec_options": {"block_size": 64}, "heartbeat_interval": 0.5,
                              "dead_after": 4, "exchange_timeout": 6}}
    config = parse_run_config(swarm_style)
    assert (config.inner.inner_steps, config.rounds.max_rounds, config.rounds.eval_every) == (7, 9, 3)
    assert config.data.default_chars == 50000 and config.compression.options == {"block_size": 64}
    assert (config.gossip.heartbeat_s, config.gossip.dead_after_s, config.gossip.exchange_timeout_s) == (0.5, 4, 6)
    assert swarm_style["rounds"] == 9  # the caller's dict is left alone


def test_training_identity_ignores_round_settings():
    a = RunConfig()
    b = RunConfig.model_validate({"rounds": {"max_rounds": 5}, "outer": {"lr": 0.5}, "gossip": {"group_size": 4}})
    c = RunConfig.model_validate({"model": {"n_layer": 2}})
    assert a.training_identity() == b.training_identity() != c.training_identity()
