"""coop: cooperative training of one GPT on pooled GPUs, DiLoCo-style.

Every worker trains its replica for K local steps; the replicas' pseudo-gradients (global minus
local weights) are encoded (`coop.codec`), shipped as safetensors bytes (`coop.wire`), averaged
and applied by an outer optimizer (`coop.diloco`). The same functions serve the single-process
simulation, the HTTP coordinator and the peer-to-peer gossip.
"""

__version__ = "0.1.0"
