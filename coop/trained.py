"""A trained model as coop hands it around (`TrainedModel`: weights, GPT config, tokenizer) and
its one-file form, the *model file*:

    model.safetensors   tensors: engine's parameter names (the tied head once, as
                        transformer.wte.weight), float32
                        __metadata__: format "coop-model", version, model_config (JSON of
                        engine.nn.GPTConfig), tokenizer (the tokenizer's own JSON), source, round

One file a user can pass straight to `coop sample` and `coop export`: what `GET /v1/model` on a
coordinator answers and what every peer writes at the end of its run (`--out`/model.safetensors).
Safetensors and JSON only: no pickle.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors
import safetensors.numpy

from engine.data import Tokenizer, tokenizer_from_json
from engine.nn import GPT, GPTConfig

from .training import load_weights

MODEL_FILE_FORMAT = "coop-model"
MODEL_FILE_VERSION = 1
MODEL_FILE_NAME = "model.safetensors"


class ModelSourceError(ValueError):
    """A path that holds no usable model; the message says what was expected and what to do."""


@dataclass
class TrainedModel:
    weights: dict[str, np.ndarray]  # engine GPT's named_parameters, float32
    config: GPTConfig
    tokenizer: Tokenizer
    source: str  # where it was read from, for messages
    round: int | None = None  # rounds (cooperative runs) or steps (`coop train`) behind these weights

    def __post_init__(self) -> None:
        if self.tokenizer.vocab_size > self.config.vocab_size:
            raise ModelSourceError(f"{self.source}: the tokenizer has {self.tokenizer.vocab_size} tokens but the "
                                   f"model only {self.config.vocab_size}; the two do not belong together")

    def model(self, device: str = "cpu") -> GPT:
        """engine's GPT with these weights, on `device`."""
        model = GPT(self.config)
        try:
            load_weights(model, self.weights)
        except KeyError as error:
            raise ModelSourceError(f"{self.source}: {error.args[0]}") from None
        return model.to(device)


def pack_model_file(trained: TrainedModel) -> bytes:
    """The model file's bytes."""
    metadata = {"format": MODEL_FILE_FORMAT, "version": str(MODEL_FILE_VERSION),
                "model_config": json.dumps(trained.config.to_dict()), "tokenizer": trained.tokenizer.to_json(),
                "source": trained.source, "round": "" if trained.round is None else str(trained.round)}
    tensors = {name: np.ascontiguousarray(array, dtype=np.float32) for name, array in trained.weights.items()}
    return safetensors.numpy.save(tensors, metadata=metadata)


def write_model_file(path: str | os.PathLike[str], trained: TrainedModel) -> Path:
    """Write the model file atomically (temp file, fsync, rename): the old one or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(pack_model_file(trained))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def model_file_metadata(path: Path) -> dict[str, str] | None:
    """The metadata of a model file, or None when `path` is a safetensors file of another kind."""
    try:
        with safetensors.safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata() or {}
    except (OSError, safetensors.SafetensorError) as error:
        raise ModelSourceError(f"{path} is not a safetensors file ({error})") from None
    return metadata if metadata.get("format") == MODEL_FILE_FORMAT else None


def read_model_file(path: str | os.PathLike[str]) -> TrainedModel:
    path = Path(path)
    metadata = model_file_metadata(path)
    if metadata is None:
        raise ModelSourceError(f"{path} is a safetensors file but not a coop model file (no format "
                               f"{MODEL_FILE_FORMAT!r} in its metadata); a Hugging Face model is read from its directory")
    if int(metadata.get("version", "0")) > MODEL_FILE_VERSION:
        raise ModelSourceError(f"{path} has model file version {metadata['version']}, newer than this coop reads "
                               f"({MODEL_FILE_VERSION}); upgrade coop")
    try:
        config = GPTConfig.from_dict(json.loads(metadata["model_config"]))
        tokenizer = tokenizer_from_json(metadata["tokenizer"])
    except (KeyError, ValueError, TypeError) as error:
        raise ModelSourceError(f"{path}: its metadata has no usable model_config and tokenizer ({error})") from None
    weights = {name: np.array(array, dtype=np.float32) for name, array in safetensors.numpy.load_file(str(path)).items()}
    rounds = metadata.get("round", "")
    return TrainedModel(weights, config, tokenizer, str(path), int(rounds) if rounds.isdigit() else None)
