"""`load_trained(PATH)`: the model a run left behind, whichever kind of run. What `coop sample`,
`coop export` and the coordinator's `GET /v1/model` read.

PATH may be
    a `coop train` checkpoint          runs/train/checkpoint (or runs/train, its --out)
    a coordinator state directory      state/ (or state/checkpoint): the global weights after the
                                       last closed round, the run config and state/data/tokenizer.json
    a model file                       what GET /v1/model answers, a peer's --out/model.safetensors
                                       (or that --out directory)
    a Hugging Face GPT-2 directory     config.json + model.safetensors + tokenizer.json
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from coop.coordinator.state import STATE_FORMAT
from coop.hf import HFFormatError, read_hf_dir
from coop.runconfig import RunConfig
from coop.trained import MODEL_FILE_NAME, ModelSourceError, TrainedModel, read_model_file
from engine.checkpoint import STATE_FILE, CheckpointError, CheckpointNotFoundError, load_checkpoint
from engine.data import load_tokenizer, tokenizer_from_json
from engine.nn import GPTConfig

KINDS = ("a `coop train` checkpoint, a coordinator state directory, a model file (GET /v1/model, a peer's "
         "--out/model.safetensors) or a Hugging Face GPT-2 directory")


def load_trained(path: str | os.PathLike[str]) -> TrainedModel:
    """The model at `path` (see the module's docstring). Raises ModelSourceError (CheckpointNotFoundError
    when nothing is there) with a message that names what was expected."""
    path = Path(path)
    try:
        if path.is_file():
            return read_model_file(path)
        if (path / STATE_FILE).is_file() or path.with_name(path.name + ".prev").is_dir():
            return _from_checkpoint(path)
        if (path / "checkpoint").exists() or (path / "checkpoint.prev").is_dir():
            return _from_checkpoint(path / "checkpoint")
        if (path / "config.json").is_file():
            return read_hf_dir(path)
        if (path / MODEL_FILE_NAME).is_file():
            return read_model_file(path / MODEL_FILE_NAME)
    except HFFormatError as error:
        raise ModelSourceError(f"{path}: {error}") from None
    except CheckpointNotFoundError:
        raise
    except CheckpointError as error:
        raise ModelSourceError(str(error)) from None
    if not path.exists():
        raise CheckpointNotFoundError(f"no checkpoint at {path}; expected {KINDS}")
    raise ModelSourceError(f"{path} holds no model; expected {KINDS}")


def _from_checkpoint(path: Path) -> TrainedModel:
    state = load_checkpoint(path)
    if state.get("format") == STATE_FORMAT:
        return _from_coordinator(path, state)
    missing = [key for key in ("model", "model_config", "tokenizer") if key not in state]
    if missing:
        raise ModelSourceError(f"{path} has no {', '.join(missing)}: not a checkpoint of `coop train` or of a "
                               "coordinator")
    weights = {name: np.asarray(array, dtype=np.float32) for name, array in state["model"].items()}
    head = weights.pop("lm_head.weight", None)  # state_dict() lists the tied head under both names
    if head is not None and "transformer.wte.weight" in weights and not np.array_equal(head, weights["transformer.wte.weight"]):
        raise ModelSourceError(f"{path}: lm_head.weight differs from transformer.wte.weight, but engine's GPT ties them")
    return TrainedModel(weights, GPTConfig.from_dict(state["model_config"]), tokenizer_from_json(state["tokenizer"]),
                        str(path), int(state["step"]) if "step" in state else None)


def _from_coordinator(path: Path, state: dict) -> TrainedModel:
    """The coordinator keeps the tokenizer beside its checkpoint (state_dir/data/tokenizer.json) and
    the model's shape in the run config: the vocabulary is the tokenizer's unless [model] sets it."""
    tokenizer_path = path.parent / "data" / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise ModelSourceError(f"{path} is a coordinator checkpoint but {tokenizer_path} is missing: pass the whole "
                               "state directory, as the coordinator wrote it")
    tokenizer = load_tokenizer(tokenizer_path)
    config = RunConfig.model_validate(state["config"]).gpt_config(tokenizer.vocab_size)
    weights = {name: np.asarray(array, dtype=np.float32) for name, array in state["weights"].items()}
    return TrainedModel(weights, config, tokenizer, f"{path.parent} (coordinator state, round {state['round']})",
                        int(state["round"]))
