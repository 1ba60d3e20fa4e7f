"""Run config files: TOML, YAML and JSON, validated, with clear errors."""
import json

import pytest

from coop.coordinator.config import EXAMPLE_TOML, ConfigError, RunConfig, load_run_config, parse_run_config


def test_example_config_parses_and_has_the_defaults(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(EXAMPLE_TOML)
    config = load_run_config(path)
    assert config.compression.codec == "int8" and config.compression.options == {"block_size": 256}
    assert config.outer.lr == 0.7 and config.outer.momentum == 0.9
    assert config.inner_total_steps() == config.rounds.max_rounds * config.inner.steps


def test_yaml_and_json(tmp_path):
    (tmp_path / "run.yaml").write_text("model:\n  n_layer: 2\ninner:\n  steps: 7\n")
    assert load_run_config(tmp_path / "run.yaml").inner.steps == 7
    (tmp_path / "run.json").write_text(json.dumps({"rounds": {"max_rounds": 3}}))
    assert load_run_config(tmp_path / "run.json").rounds.max_rounds == 3


@pytest.mark.parametrize("raw, message", [
    ({"model": {"n_embd": 30, "n_head": 4}}, "divisible"),
    ({"rounds": {"max_roundz": 3}}, "rounds.max_roundz"),
    ({"compression": {"codec": "int8", "options": {"block_size": 0}}}, "block_size"),
    ({"compression": {"codec": "zip"}}, "compression.codec"),
    ({"rounds": {"min_deadline_s": 10, "max_deadline_s": 5}}, "min_deadline_s"),
    ({"rounds": {"heartbeat_s": 60, "worker_timeout_s": 30}}, "heartbeat_s"),
    ({"outer": {"momentum": 0.0}}, "nesterov"),
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


def test_training_identity_ignores_round_settings():
    a = RunConfig()
    b = RunConfig.model_validate({"rounds": {"max_rounds": 5}, "outer": {"lr": 0.5}})
    c = RunConfig.model_validate({"model": {"n_layer": 2}})
    assert a.training_identity() == b.training_identity() != c.training_identity()
