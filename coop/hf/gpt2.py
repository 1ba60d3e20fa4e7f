"""engine's GPT <-> Hugging Face GPT-2 (`transformers.GPT2LMHeadModel`): the config and the tensors.

The two are the same network: pre-LN blocks, tanh GELU (GPT-2's "gelu_new"), layer norm eps 1e-5,
learned positions, q/k/v fused in that order with the heads side by side, the head tied to the
token embedding. Only the storage differs:

    engine (named_parameters)             GPT-2 (model.safetensors)                layout
    transformer.wte.weight (V, C)         transformer.wte.weight (V, C)            same
    transformer.wpe.weight (T, C)         transformer.wpe.weight (T, C)            same
    transformer.h.i.ln_1.weight (C,)      transformer.h.i.ln_1.weight (C,)         same (ln_2, ln_f too)
    transformer.h.i.attn.c_attn.weight    transformer.h.i.attn.c_attn.weight       Linear (3C, C) is
        (3C, C)                               (C, 3C)                              Conv1D (C, 3C): transposed
    ... attn.c_proj, mlp.c_fc, mlp.c_proj the same way; biases (out,) are the same in both
    (tied to wte)                         lm_head.weight: left out, tie_word_embeddings

An engine GPT without biases (`bias=False`) has none to write: GPT-2 gets zeros there, which is
the same function. Reading, the "transformer." prefix may be missing (files of GPT2Model) and the
causal-mask buffers of old files (`attn.bias` (1, 1, T, T), `attn.masked_bias`) are skipped.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from engine.nn import GPTConfig

LAYER_NORM_EPS = 1e-5  # engine.nn.LayerNorm's, as GPT2Config's layer_norm_epsilon default
# GPT-2's names for the tanh GELU engine computes (gelu_fast is the same formula rearranged)
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # stored (in, out) by GPT-2
PREFIX = "transformer."
_MASK_BUFFER = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")


class HFFormatError(ValueError):
    """A model that does not map between engine's GPT and GPT-2; the message says why and what to do."""


def expected_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """engine's parameter names -> shapes, biases included (as GPT-2 has them all)."""
    C, V, T = config.n_embd, config.vocab_size, config.block_size
    shapes: dict[str, tuple[int, ...]] = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (T, C)}
    for i in range(config.n_layer):
        block = f"transformer.h.{i}."
        for norm in ("ln_1", "ln_2"):
            shapes[block + norm + ".weight"] = shapes[block + norm + ".bias"] = (C,)
        for name, (out, inp) in zip(CONV1D, ((3 * C, C), (C, C), (4 * C, C), (C, 4 * C))):
            shapes[block + name + ".weight"] = (out, inp)
            shapes[block + name + ".bias"] = (out,)
    shapes["transformer.ln_f.weight"] = shapes["transformer.ln_f.bias"] = (C,)
    return shapes


def _is_conv1d(name: str) -> bool:
    return name.endswith(".weight") and any(f".{part}." in name for part in CONV1D)


def to_hf_tensors(weights: dict[str, np.ndarray], config: GPTConfig) -> dict[str, np.ndarray]:
    """engine weights (named_parameters, float32) -> GPT-2's tensors, Conv1D weights transposed,
    missing biases (bias=False) as zeros. Raises HFFormatError on a name or shape GPT-2 lacks."""
    out: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes(config).items():
        if name not in weights:
            if not name.endswith(".bias") or config.bias:
                raise HFFormatError(f"the weights have no {name}, which a GPT of {config} has; "
                                    "is the checkpoint complete?")
            out[name] = np.zeros(shape, dtype=np.float32)
            continue
        array = np.asarray(weights[name], dtype=np.float32)
        if array.shape != shape:
            raise HFFormatError(f"{name} has shape {array.shape}, expected {shape} for a GPT of {config}")
        out[name] = np.ascontiguousarray(array.T if _is_conv1d(name) else array)
    extra = sorted(set(weights) - set(out) - {"lm_head.weight"})
    if extra:
        raise HFFormatError(f"the weights hold tensors GPT-2 has no place for: {', '.join(extra[:5])}")
    return out


def from_hf_tensors(tensors: dict[str, np.ndarray], config: GPTConfig, tied: bool = True) -> dict[str, np.ndarray]:
    """GPT-2's tensors (any float dtype) -> engine weights (named_parameters, float32, C-contiguous).

    A head (lm_head.weight) is accepted only if it equals the token embedding: engine's GPT ties them."""
    plain = {}
    for name, array in tensors.items():
        bare = name[len(PREFIX):] if name.startswith(PREFIX) else name
        if _MASK_BUFFER.match(bare):
            continue  # the causal mask of old GPT-2 files: not a parameter
        plain[name if name == "lm_head.weight" else PREFIX + bare] = array
    head = plain.pop("lm_head.weight", None)
    shapes = expected_shapes(config)
    missing = sorted(set(shapes) - set(plain))
    extra = sorted(set(plain) - set(shapes))
    if missing or extra:
        raise HFFormatError(f"the safetensors do not hold a GPT-2 of this config.json: missing {missing[:5]}, "
                            f"unexpected {extra[:5]}; is it a GPT2LMHeadModel saved with save_pretrained?")
    weights = {}
    for name, shape in shapes.items():
        hf_shape = shape[::-1] if _is_conv1d(name) else shape
        array = np.asarray(plain[name])
        if array.shape != hf_shape:
            raise HFFormatError(f"{name} has shape {array.shape}, expected {hf_shape} from config.json")
        array = array.astype(np.float32)
        weights[name] = np.ascontiguousarray(array.T if _is_conv1d(name) else array)
    if head is not None and not np.array_equal(np.asarray(head, dtype=np.float32), weights["transformer.wte.weight"]):
        raise HFFormatError("lm_head.weight differs from transformer.wte.weight: engine's GPT ties its head to "
                            "the token embedding (tie_word_embeddings), so an untied GPT-2 cannot be loaded")
    if head is None and not tied:
        raise HFFormatError("config.json says tie_word_embeddings: false but the file has no lm_head.weight")
    return weights


def to_hf_config(config: GPTConfig, bos_id: int | None, eos_id: int | None) -> dict[str, Any]:
    """GPT2Config's fields (config.json) for engine's GPT."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,  # 4 n_embd, as engine's MLP
        "activation_function": "gelu_new",  # the tanh GELU (engine.nn.functional.gelu)
        "resid_pdrop": config.dropout, "embd_pdrop": config.dropout, "attn_pdrop": config.dropout,
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "initializer_range": 0.02,
        "scale_attn_weights": True,  # 1/sqrt(head dim), as engine's attention
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": None,
        "dtype": "float32",
    }


def from_hf_config(hf: dict[str, Any], dropout: float = 0.0) -> tuple[GPTConfig, bool]:
    """config.json of a GPT-2 -> (engine's GPTConfig, whether the head is tied). Everything that
    would make it another network than engine's GPT is refused with the field that differs."""
    if hf.get("model_type") != "gpt2":
        raise HFFormatError(f"config.json has model_type {hf.get('model_type')!r}, expected 'gpt2': engine's GPT "
                            "is GPT-2's architecture and nothing else maps onto it")
    try:
        n_embd, n_layer, n_head = int(hf["n_embd"]), int(hf["n_layer"]), int(hf["n_head"])
        vocab, positions = int(hf["vocab_size"]), int(hf.get("n_positions", hf.get("n_ctx")))
    except (KeyError, TypeError, ValueError) as error:
        raise HFFormatError(f"config.json lacks a GPT-2 field or has a bad one ({error}); expected integers "
                            "n_embd, n_layer, n_head, vocab_size, n_positions") from None
    checks = [
        ("activation_function", hf.get("activation_function", "gelu_new") in TANH_GELUS,
         f"one of {', '.join(TANH_GELUS)} (engine's GELU is the tanh form)"),
        ("layer_norm_epsilon", abs(float(hf.get("layer_norm_epsilon", LAYER_NORM_EPS)) - LAYER_NORM_EPS) < 1e-12,
         f"{LAYER_NORM_EPS} (engine's layer norm)"),
        ("n_inner", hf.get("n_inner") in (None, 4 * n_embd), f"null or {4 * n_embd} (4 n_embd)"),
        ("scale_attn_weights", hf.get("scale_attn_weights", True) is True, "true"),
        ("scale_attn_by_inverse_layer_idx", not hf.get("scale_attn_by_inverse_layer_idx", False), "false"),
        ("add_cross_attention", not hf.get("add_cross_attention", False), "false"),
        ("n_embd", n_head >= 1 and n_embd % n_head == 0, f"a multiple of n_head {n_head}"),
    ]
    bad = [f"{name} {hf.get(name)!r} (expected {expected})" for name, ok, expected in checks if not ok]
    if bad:
        raise HFFormatError(f"config.json describes a GPT-2 variant engine's GPT cannot run: {'; '.join(bad)}")
    config = GPTConfig(vocab_size=vocab, block_size=positions, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                       dropout=dropout, bias=True)
    return config, bool(hf.get("tie_word_embeddings", True))
