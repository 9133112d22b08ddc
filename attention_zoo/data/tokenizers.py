"""Tokenisers of the source-conditioned text tasks (``seq2seq``): UTF-8 bytes by default, or a local Hugging Face
tokenizer behind the same interface (``encode``, ``decode``, the PAD/BOS/SEP/EOS ids and ``vocab_size``)."""

from __future__ import annotations

from .fetch import DatasetNotFoundError


class ByteTokenizer:
    """UTF-8 bytes shifted by 4 past the specials PAD=0, BOS=1, SEP=2, EOS=3 (vocabulary 260)."""

    name = "bytes"
    pad_id, bos_id, sep_id, eos_id = 0, 1, 2, 3
    vocab_size = 260

    def encode(self, text: str) -> list[int]:
        return [b + 4 for b in text.encode("utf-8")]

    def decode(self, ids) -> str:
        return bytes(int(i) - 4 for i in ids if int(i) >= 4).decode("utf-8", errors="replace")


def _first(*ids):
    return next((i for i in ids if i is not None), None)


class HFTokenizer:
    """A Hugging Face tokenizer behind the same interface. BOS falls back to CLS, EOS to SEP, SEP to EOS (BERT has
    no BOS/EOS, BART's separator is its EOS).

    Raises:
        ValueError: the tokenizer lacks a pad token or any BOS/CLS, EOS/SEP token.
    """

    def __init__(self, tokenizer):
        t = tokenizer
        self.tok, self.name, self.vocab_size = t, getattr(t, "name_or_path", type(t).__name__), len(t)
        self.pad_id = t.pad_token_id
        self.bos_id = _first(t.bos_token_id, t.cls_token_id)
        self.eos_id = _first(t.eos_token_id, t.sep_token_id)
        self.sep_id = _first(t.sep_token_id, t.eos_token_id)
        if None in (self.pad_id, self.bos_id, self.eos_id, self.sep_id):
            raise ValueError(f"tokenizer: {self.name} needs pad and BOS/CLS and EOS/SEP tokens")
        self._special = {self.pad_id, self.bos_id, self.eos_id, self.sep_id}

    @classmethod
    def from_pretrained(cls, name_or_path: str) -> HFTokenizer:
        """Load from a local directory or the HF cache only (never the network).

        Raises:
            DatasetNotFoundError: not available locally; the message says how to provide it.
        """
        from transformers import AutoTokenizer

        try:
            return cls(AutoTokenizer.from_pretrained(name_or_path, local_files_only=True))
        except OSError as exc:
            raise DatasetNotFoundError(f"tokenizer {name_or_path!r} is not available locally ({exc}); pass a "
                                       "directory holding its tokenizer files, or download it once into the HF "
                                       "cache with network access") from exc

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids if int(i) not in self._special], skip_special_tokens=True)


def load_tokenizer(name: str = "bytes"):
    """``"bytes"`` -> :class:`ByteTokenizer`; anything else -> :meth:`HFTokenizer.from_pretrained`."""
    return ByteTokenizer() if name == "bytes" else HFTokenizer.from_pretrained(name)
