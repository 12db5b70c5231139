"""A byte-level tokenizer: UTF-8 bytes are token ids 0-255, so nothing is downloaded."""

from __future__ import annotations


class ByteTokenizer:
    bos_token_id = 256
    eos_token_id = 257
    vocab_size = 258

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")
