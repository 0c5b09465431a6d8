"""A byte-level tokenizer: every UTF-8 byte is one token, plus three specials.

Byte-level tokenization is the simplest scheme that can represent *any* text
exactly, which makes it ideal for a book about inference: nothing about the
decoding algorithms depends on the tokenizer, and a round trip never loses data.
"""
from __future__ import annotations

from collections.abc import Iterable

N_BYTES = 256
BOS, EOS, PAD = 256, 257, 258
SPECIALS = {"<bos>": BOS, "<eos>": EOS, "<pad>": PAD}
VOCAB_SIZE = N_BYTES + len(SPECIALS)


class ByteTokenizer:
    """Maps text <-> token ids. Ids 0-255 are raw bytes; 256-258 are specials."""

    vocab_size = VOCAB_SIZE
    bos_id, eos_id, pad_id = BOS, EOS, PAD

    def encode(self, text: str, bos: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode() takes str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        return [BOS, *ids] if bos else ids

    def encode_bytes(self, data: bytes) -> list[int]:
        return list(bytes(data))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Bytes of the non-special ids; specials carry no text and are dropped."""
        out = bytearray()
        for i in ids:
            i = int(i)
            if not 0 <= i < VOCAB_SIZE:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {VOCAB_SIZE})")
            if i < N_BYTES:
                out.append(i)
        return bytes(out)

    def decode(self, ids: Iterable[int]) -> str:
        # A model can emit a byte sequence that is not valid UTF-8 (e.g. it stops
        # halfway through a multi-byte character); show those as U+FFFD rather
        # than failing. Valid input round-trips exactly.
        return self.decode_bytes(ids).decode("utf-8", errors="replace")
