"""engine.nn: modules, layers and models, as in torch.nn."""
from . import functional, init
from .module import Module, ModuleDict, ModuleList, Parameter, Sequential
from .layers import GELU, Dropout, Embedding, LayerNorm, Linear, ReLU
from .transformer import (MLP, KVCache, LearnedPositionalEmbedding, MultiHeadAttention, SinusoidalPositionalEncoding,
                          TransformerBlock, TransformerEncoder, TransformerLM, causal_mask)
from .gpt import GPT, GPTConfig
from . import parallel  # noqa: E402  (engine.nn.parallel.DistributedDataParallel, as torch.nn.parallel)

__all__ = ["functional", "init", "Module", "ModuleDict", "ModuleList", "Parameter", "Sequential", "GELU", "Dropout",
           "Embedding", "LayerNorm", "Linear", "ReLU", "MLP", "KVCache", "LearnedPositionalEmbedding",
           "MultiHeadAttention", "SinusoidalPositionalEncoding", "TransformerBlock", "TransformerEncoder",
           "TransformerLM", "causal_mask", "GPT", "GPTConfig"]
