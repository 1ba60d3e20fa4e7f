"""`[model] init_from = "HF_DIR"`: a cooperative run whose global model starts from a Hugging Face
GPT-2 directory, so that a swarm (or a coordinator's workers) can continue training GPT-2.

Where a run starts (the coordinator; the first peer of a swarm) the directory is read once:

    config, trained = load_init_from(config)
        the [model] keys left out are filled in from the directory's config.json (vocab_size,
        n_layer, n_head, n_embd, block_size; bias is true, as GPT-2's); keys given must agree.
        The filled-in config is what the run records and sends to the others, so that nobody
        else needs the directory; `trained` holds the weights and the tokenizer.

    config = seed_coordinator_state(config, state_dir)
        before `Coordinator(config, state_dir)`: the data tokenized with the directory's tokenizer
        (state_dir/data) and the imported weights saved as round 0 of the state directory, which
        the coordinator then starts from as from any saved run. Resuming, nothing is read.
"""
from __future__ import annotations

import logging
from pathlib import Path

from coop.coordinator.data import prepare_data
from coop.coordinator.state import load_run, make_private_dir, make_private_tree, save_round
from coop.hf import read_hf_dir
from coop.runconfig import ConfigError, RunConfig, parse_run_config
from coop.trained import TrainedModel

SHAPE = ("vocab_size", "n_layer", "n_head", "n_embd", "block_size")
log = logging.getLogger("coop.coordinator")


def _with_model(config: RunConfig, model: dict) -> RunConfig:
    raw = config.model_dump()
    raw["model"] = model
    return parse_run_config(raw, "run config")


def load_init_from(config: RunConfig) -> tuple[RunConfig, TrainedModel]:
    """The config with the directory's shape filled in, and the imported model. Raises ConfigError
    (a missing directory, not a GPT-2, [model] keys that disagree) saying what to do."""
    model = config.model
    try:
        trained = read_hf_dir(model.init_from, dropout=model.dropout)
    except ValueError as error:  # HFFormatError, ModelSourceError
        raise ConfigError(f"model.init_from = {model.init_from!r}: {error}") from None
    imported = trained.config
    given = model.model_fields_set
    bad = [f"model.{name} = {getattr(model, name)} (the directory's: {getattr(imported, name)})"
           for name in SHAPE if name in given and getattr(model, name) != getattr(imported, name)]
    if "bias" in given and not model.bias:
        bad.append("model.bias = false (GPT-2 has biases)")
    if bad:
        raise ConfigError(f"model.init_from = {model.init_from!r}: the [model] section disagrees with it: "
                          f"{'; '.join(bad)}; leave these keys out (the shape comes from the directory)")
    filled = {**model.model_dump(), **{name: getattr(imported, name) for name in SHAPE}, "bias": True}
    return _with_model(config, filled), trained


def seed_coordinator_state(config: RunConfig, state_dir: str | Path) -> RunConfig:
    """Before the coordinator starts on `state_dir`: with init_from, a new run's data and round-0
    weights from the directory; a run already saved there keeps its own (its recorded shape fills
    in the keys left out). Without init_from: `config` unchanged."""
    if not config.model.init_from:
        return config
    state_dir = Path(state_dir)
    saved = load_run(state_dir) if state_dir.exists() else None
    if saved is not None:
        stored = RunConfig.model_validate(saved.config).model
        if stored.init_from == config.model.init_from:  # resuming: the coordinator compares the rest
            given = config.model.model_dump(include=config.model.model_fields_set)
            return _with_model(config, {**stored.model_dump(), **given})
        return config  # another run: the coordinator refuses it, saying why
    config, trained = load_init_from(config)
    make_private_dir(state_dir)
    data = prepare_data(config.data, state_dir / "data", config.model.block_size, tokenizer=trained.tokenizer)
    make_private_tree(state_dir / "data")
    config.gpt_config(data.vocab_size)  # the tokenizer fits the model (raises ValueError otherwise)
    # what Coordinator.__init__ saves for a new run, with these weights: round 0, a fresh outer
    # optimizer, the loss curve's starting record (the workers' round-0 val reports go there)
    save_round(state_dir, round_number=0, weights=trained.weights, outer_state=config.outer_optimizer().state_dict(),
               history=[{"round": None, "outer_steps": 0}], config=config.model_dump())
    log.info("a new run from %s: %d parameters and %r as round 0 of %s", config.model.init_from,
             sum(a.size for a in trained.weights.values()), trained.tokenizer, state_dir)
    return config
