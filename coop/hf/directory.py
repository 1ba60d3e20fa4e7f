"""A Hugging Face GPT-2 directory, written from and read into a `coop.trained.TrainedModel`:

    config.json               GPT2Config (coop.hf.gpt2.to_hf_config)
    generation_config.json    bos / eos ids
    model.safetensors         GPT-2's tensor names, Conv1D layout (coop.hf.gpt2)
    tokenizer.json            + tokenizer_config.json, special_tokens_map.json (coop.hf.tokenizer)

`transformers.GPT2LMHeadModel.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load
what `write_hf_dir` writes. `read_hf_dir` reads such a directory (and what `save_pretrained`
writes: model.safetensors or shards with model.safetensors.index.json, float32, float16 or
bfloat16); never pytorch_model.bin, which is a pickle.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy

from coop.trained import TrainedModel

from .gpt2 import HFFormatError, from_hf_config, from_hf_tensors, to_hf_config, to_hf_tensors
from .tokenizer import bos_eos_ids, tokenizer_files, tokenizer_from_hf_json

WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
# safetensors dtype tags -> how to read them as float32; bfloat16 is the top half of a float32
_FLOATS = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"), "BF16": np.dtype("<u2")}


def _write(path: Path, content: str | bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(content.encode("utf-8") if isinstance(content, str) else content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_hf_dir(trained: TrainedModel, out_dir: str | os.PathLike[str], overwrite: bool = False) -> list[Path]:
    """Write `trained` as a GPT-2 directory; returns the files written. Everything that cannot map
    (a name, a shape, the tokenizer) raises HFFormatError before any file is written."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not overwrite)):
        raise HFFormatError(f"{out} exists and is not an empty directory; choose another OUT_DIR or pass --overwrite")
    tensors = to_hf_tensors(trained.weights, trained.config)
    bos, eos = bos_eos_ids(trained.tokenizer)
    files: dict[str, Any] = tokenizer_files(trained.tokenizer, trained.config.block_size)
    files["config.json"] = to_hf_config(trained.config, bos, eos)
    files["generation_config.json"] = {k: v for k, v in {"bos_token_id": bos, "eos_token_id": eos}.items()
                                       if v is not None}
    # transformers refuses a safetensors file whose metadata lacks format "pt" (the tensors are plain)
    files[WEIGHTS] = safetensors.numpy.save(tensors, metadata={"format": "pt"})
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in files.items():
        text_or_bytes = content if isinstance(content, (str, bytes)) else json.dumps(content, indent=2) + "\n"
        _write(out / name, text_or_bytes)
        written.append(out / name)
    return written


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """One safetensors file -> float32 arrays (numpy has no bfloat16, so its tensors are widened here)."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        base = 8 + header_len
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _FLOATS.get(entry["dtype"])
        if dtype is None:
            raise HFFormatError(f"{path.name}: tensor {name} is {entry['dtype']}; expected F32, F16, BF16 or F64")
        start, end = entry["data_offsets"]
        count = (end - start) // dtype.itemsize
        raw = np.fromfile(path, dtype=dtype, count=count, offset=base + start)
        array = (raw.astype(np.uint32) << 16).view(np.float32) if entry["dtype"] == "BF16" else raw.astype(np.float32)
        out[name] = array.reshape(entry["shape"])
    return out


def _read_tensors(directory: Path) -> dict[str, np.ndarray]:
    if (directory / WEIGHTS).is_file():
        return _read_safetensors(directory / WEIGHTS)
    if (directory / INDEX).is_file():
        weight_map = json.loads((directory / INDEX).read_text(encoding="utf-8")).get("weight_map", {})
        tensors: dict[str, np.ndarray] = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(_read_safetensors(directory / shard))
        return tensors
    if any((directory / name).exists() for name in ("pytorch_model.bin", "model.bin")):
        raise HFFormatError(f"only pytorch_model.bin (a pickle, which coop never reads), no {WEIGHTS}; convert "
                            "it: GPT2LMHeadModel.from_pretrained(DIR).save_pretrained(DIR) writes safetensors")
    raise HFFormatError(f"no {WEIGHTS}; save the model there with save_pretrained(DIR)")


def read_hf_config(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """config.json of a Hugging Face model directory, with errors that say what to do (HFFormatError
    messages name the file, not the directory: the caller says which directory it read)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise HFFormatError("no such directory; give the directory that save_pretrained wrote "
                            "(with config.json and model.safetensors)")
    path = directory / "config.json"
    if not path.is_file():
        raise HFFormatError("no config.json: not a Hugging Face model directory (save the model there with "
                            "save_pretrained)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise HFFormatError(f"config.json is not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise HFFormatError("config.json: expected a JSON object")
    return config


def read_hf_tokenizer(directory: Path):
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise HFFormatError("no tokenizer.json (the run must tokenize with the model's own tokenizer); "
                            "save it there: AutoTokenizer.from_pretrained(...).save_pretrained(DIR)")
    return tokenizer_from_hf_json(path.read_text(encoding="utf-8"))


def read_hf_dir(directory: str | os.PathLike[str], dropout: float = 0.0) -> TrainedModel:
    """A GPT-2 directory (config.json, model.safetensors, tokenizer.json) as engine weights."""
    directory = Path(directory)
    config, tied = from_hf_config(read_hf_config(directory), dropout)
    tokenizer = read_hf_tokenizer(directory)
    weights = from_hf_tensors(_read_tensors(directory), config, tied)
    return TrainedModel(weights, config, tokenizer, str(directory))
