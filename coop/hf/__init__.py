"""Models in and out of the Hugging Face GPT-2 format (no transformers or torch needed here).

    gpt2.py        the config and tensor mapping between engine's GPT and GPT2LMHeadModel
    tokenizer.py   coop's char / BPE tokenizers <-> tokenizer.json
    directory.py   write_hf_dir / read_hf_dir: a whole save_pretrained-style directory
"""
from coop.hf.directory import read_hf_config, read_hf_dir, write_hf_dir
from coop.hf.gpt2 import HFFormatError

__all__ = ["HFFormatError", "read_hf_config", "read_hf_dir", "write_hf_dir"]
