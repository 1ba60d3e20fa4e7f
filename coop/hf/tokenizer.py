"""coop's tokenizers <-> Hugging Face tokenizer files (tokenizer.json, read by the `tokenizers`
package and by `transformers.AutoTokenizer`).

- The byte-level BPE (engine.data.BPETokenizer) already is a `tokenizers` tokenizer: its JSON is
  GPT-2's kind of tokenizer.json as it is (ByteLevel pre-tokenizer and decoder, the BPE model,
  <|endoftext|> as an added special token).
- The character tokenizer (engine.data.CharTokenizer) becomes a WordLevel model over its
  characters with the same ids (sorted code points), a pre-tokenizer that splits the text into
  single code points (`Split` on the regex [\\s\\S], "isolated": newlines included) and the
  `Fuse` decoder (tokens joined with nothing between them). A character outside the vocabulary
  fails to encode, as in CharTokenizer ("<unk>" is named but not in the vocabulary). Lone
  surrogates, which Python strings may hold but tokenizer.json (UTF-8) cannot, do not map.

Read back, a tokenizer.json of exactly that character form is a CharTokenizer again; any other
one is used through the `tokenizers` package (engine.data.BPETokenizer wraps any of them).
"""
from __future__ import annotations

import json
from typing import Any

import tokenizers

from engine.data import BPETokenizer, CharTokenizer, Tokenizer, tokenizer_from_json

from .gpt2 import HFFormatError

CHAR_SPLIT = r"[\s\S]"  # one code point, newline included (Oniguruma's "." stops at "\n")
UNKNOWN = "<unk>"  # named by the WordLevel model, never in a character vocabulary: unknown chars fail
TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # loads tokenizer.json as it is, whatever model it holds


def char_tokenizer_json(tokenizer: CharTokenizer) -> str:
    """The `tokenizers` JSON of a character tokenizer (same ids). Raises HFFormatError on lone surrogates."""
    surrogates = [c for c in tokenizer.chars if 0xD800 <= ord(c) <= 0xDFFF]
    if surrogates:
        raise HFFormatError(f"the character vocabulary holds {len(surrogates)} lone surrogate(s) "
                            f"({', '.join(f'U+{ord(c):04X}' for c in surrogates[:3])}), which a UTF-8 tokenizer.json "
                            "cannot hold; retrain on text decoded without errors='surrogateescape'")
    model = tokenizers.models.WordLevel(vocab={c: i for i, c in enumerate(tokenizer.chars)}, unk_token=UNKNOWN)
    hf = tokenizers.Tokenizer(model)
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex(CHAR_SPLIT), behavior="isolated")
    hf.decoder = tokenizers.decoders.Fuse()
    return hf.to_str()


def special_tokens(tokenizer: Tokenizer) -> list[str]:
    return list(getattr(tokenizer, "special_tokens", []))


def tokenizer_files(tokenizer: Tokenizer, model_max_length: int) -> dict[str, Any]:
    """file name -> content (a str for tokenizer.json, dicts for the others) of a Hugging Face
    tokenizer directory. The first special token (BPE: <|endoftext|>) is bos, eos and unk, as GPT-2's."""
    if isinstance(tokenizer, CharTokenizer):
        tokenizer_json = char_tokenizer_json(tokenizer)
    elif isinstance(tokenizer, BPETokenizer):
        tokenizer_json = tokenizer.to_json()
    else:
        raise HFFormatError(f"no Hugging Face form for a {type(tokenizer).__name__}; expected coop's char or bpe tokenizer")
    specials = special_tokens(tokenizer)
    named = {"bos_token": specials[0], "eos_token": specials[0], "unk_token": specials[0]} if specials else {}
    config = {"tokenizer_class": TOKENIZER_CLASS, "model_max_length": model_max_length,
              "clean_up_tokenization_spaces": False,  # else decode would rewrite " ," as ","
              **named}
    return {"tokenizer.json": tokenizer_json, "tokenizer_config.json": config, "special_tokens_map.json": named}


def bos_eos_ids(tokenizer: Tokenizer) -> tuple[int | None, int | None]:
    return tokenizer.eot_id, tokenizer.eot_id


def _char_form(obj: Any) -> list[str] | None:
    """The characters, if `obj` (a parsed tokenizer.json) is exactly the form char_tokenizer_json writes."""
    if not isinstance(obj, dict) or obj.get("normalizer") or obj.get("post_processor") or obj.get("added_tokens"):
        return None
    model, pre, decoder = obj.get("model") or {}, obj.get("pre_tokenizer") or {}, obj.get("decoder") or {}
    if (model.get("type") != "WordLevel" or pre.get("type") != "Split" or decoder.get("type") != "Fuse"
            or pre.get("pattern") != {"Regex": CHAR_SPLIT} or pre.get("behavior") != "Isolated" or pre.get("invert")):
        return None
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        return None
    chars = sorted(vocab, key=vocab.get)
    if any(len(c) != 1 for c in chars) or chars != sorted(chars) or [vocab[c] for c in chars] != list(range(len(chars))):
        return None
    return chars


def tokenizer_from_hf_json(serialized: str) -> Tokenizer:
    """An engine tokenizer from a tokenizer.json: CharTokenizer for coop's character form, else the
    `tokenizers` tokenizer itself (GPT-2's byte-level BPE, or any other)."""
    try:
        obj = json.loads(serialized)
    except json.JSONDecodeError as error:
        raise HFFormatError(f"tokenizer.json is not valid JSON ({error})") from None
    chars = _char_form(obj)
    if chars is not None:
        return CharTokenizer(chars)
    try:
        return tokenizer_from_json(serialized)
    except Exception as error:  # the tokenizers package's own parse errors
        raise HFFormatError(f"tokenizer.json could not be read by the tokenizers package ({error})") from None
