"""GPT: a GPT-2 style language model (pre-LN blocks, GELU MLP, learned positions, tied head)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from ..autocast import cast_weights
from ..autograd import no_grad
from ..random import default_generator
from ..factories import arange
from ..methods.shape import cat
from ..tensor import Tensor, tensor
from . import functional as F
from . import init
from .layers import Dropout, Embedding, LayerNorm, Linear
from .module import Module, ModuleDict, ModuleList
from .transformer import KVCache, TransformerBlock, run_blocks


@dataclass
class GPTConfig:
    vocab_size: int = 50304
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"GPTConfig: unknown fields {sorted(unknown)}; expected some of {sorted(names)}")
        return cls(**d)


class GPT(Module):
    """idx (B, T) int64 -> logits (B, T, vocab_size); with targets, the mean cross-entropy instead,
    from the fused classifier (see forward: return_logits=True gives both).

    Parameter names follow GPT-2 / nanoGPT (transformer.wte, transformer.h.0.attn.c_attn, ...)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"GPTConfig: n_embd {config.n_embd} must be divisible by n_head {config.n_head}")
        self.config = config
        self.transformer = ModuleDict(dict(
            wte=Embedding(config.vocab_size, config.n_embd),
            wpe=Embedding(config.block_size, config.n_embd),
            drop=Dropout(config.dropout),
            h=ModuleList(TransformerBlock(config.n_embd, config.n_head, config.dropout, config.bias)
                         for _ in range(config.n_layer)),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer["wte"].weight  # weight tying, as GPT-2
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2: N(0, 0.02) weights, zero biases, residual projections scaled by 1/sqrt(2 n_layer)."""
        for name, module in self.named_modules():
            if isinstance(module, Linear):
                std = 0.02 / math.sqrt(2 * self.config.n_layer) if name.endswith("c_proj") else 0.02
                init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    init.zeros_(module.bias)
            elif isinstance(module, Embedding):
                init.normal_(module.weight, 0.0, 0.02)

    def _hidden(self, idx: Tensor, caches: list | None = None, start: int = 0) -> Tensor:
        """idx (B, T) at positions start..start+T-1 -> final hidden states (B, T, C)."""
        B, T = idx.shape
        if start + T > self.config.block_size:
            raise ValueError(f"GPT: sequence of {start + T} tokens exceeds block_size {self.config.block_size}; "
                             "crop the input (generate() does this itself)")
        tr = self.transformer
        wte, wpe = tr["wte"], tr["wpe"]
        if type(wte).forward is Embedding.forward and type(wpe).forward is Embedding.forward:
            x = F.embedding_with_positions(idx, wte.weight, wpe.weight, start)  # one op (on the GPU one kernel)
        else:
            x = wte(idx) + wpe(arange(start, start + T, device=idx.device))
        x = tr["drop"](x)
        return run_blocks(tr["h"], x, tr["ln_f"], caches)

    def forward(self, idx: Tensor, targets: Tensor | None = None, *, return_logits: bool = False):
        """idx (B, T) int64 -> (logits (B, T, V), None); with targets (B, T) -> (None, loss).

        With targets, the head and the mean cross-entropy (targets of -1 ignored) are one fused op,
        F.linear_cross_entropy, which never keeps the (B*T, V) logits and so returns none; pass
        return_logits=True to get them too, as (logits, loss), from the unfused head."""
        if idx.ndim != 2:
            raise ValueError(f"GPT: idx must be (B, T) token indices, got shape {idx.shape}")
        with cast_weights(self._cast_weights()):  # under autocast: the GEMMs' weights in one launch
            hidden = self._hidden(idx)  # (B, T, C)
            if targets is not None and not return_logits:
                loss = F.linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), self.lm_head.weight,
                                              targets.reshape(-1), ignore_index=-1, fp8=self.lm_head.fp8)
                return None, loss
            logits = self.lm_head(hidden)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def _cast_weights(self) -> list[Tensor]:
        """The parameters that autocast runs in bf16: the linear layers' weights and biases, the head's
        (the tied embedding) among them; the embeddings' lookups and the layer norms read float32."""
        params = []
        for module in self.modules():
            if isinstance(module, Linear):
                params += [module.weight] + ([module.bias] if module.bias is not None else [])
        return params

    def optimizer_groups(self, weight_decay: float) -> list[dict]:
        """Parameter groups as GPT-2 trains them: matrices decayed, biases and norms not."""
        decay = [p for p in self.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.parameters() if p.ndim < 2]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    @no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, use_cache: bool = True, generator: np.random.Generator | None = None) -> Tensor:
        """Append max_new_tokens sampled tokens to idx (B, T). temperature 0 picks the most likely token.

        With use_cache, each layer keeps its keys and values, so a new token costs one position's
        forward pass; once the context is full, the window slides and is recomputed, as without cache."""
        was_training = self.training
        self.eval()
        gen = generator or default_generator()
        block = self.config.block_size
        caches = [KVCache() for _ in range(self.config.n_layer)] if use_cache else None
        fed = 0  # tokens of idx already in the caches
        try:
            for _ in range(max_new_tokens):
                if use_cache and idx.shape[1] <= block:
                    h = self._hidden(idx[:, fed:], caches, start=fed)
                    fed = idx.shape[1]
                else:
                    h = self._hidden(idx[:, -block:])
                logits = self.lm_head(h[:, -1, :])  # (B, V): the head only at the last position
                next_tok = sample_next(logits.numpy().astype(np.float64), temperature, top_k, top_p, gen)
                idx = cat([idx, tensor(next_tok[:, None], device=idx.device)], dim=1)
        finally:
            self.train(was_training)
        return idx


def sample_next(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
                gen: np.random.Generator) -> np.ndarray:
    """logits (B, V) -> token ids (B,), after temperature, top-k and nucleus (top-p) filtering."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(axis=-1).astype(np.int64)
    logits = logits / temperature
    if top_k is not None:
        k = min(int(top_k), logits.shape[-1])
        kth = np.sort(logits, axis=-1)[:, -k][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-probs, axis=-1)
        sorted_p = np.take_along_axis(probs, order, axis=-1)
        keep_sorted = np.cumsum(sorted_p, axis=-1) - sorted_p < top_p  # always keeps the top token
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    u = gen.random((probs.shape[0], 1))
    return np.minimum((np.cumsum(probs, axis=-1) < u).sum(axis=-1), probs.shape[-1] - 1).astype(np.int64)
