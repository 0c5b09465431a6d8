import pytest
from hypothesis import given
from hypothesis import strategies as st

from minillm.tokenizer import BOS, EOS, VOCAB_SIZE, ByteTokenizer

tok = ByteTokenizer()


@given(st.text())
def test_encode_roundtrip_arbitrary_unicode(text):
    assert tok.decode(tok.encode(text)) == text


@given(st.binary())
def test_encode_bytes_roundtrip_arbitrary_bytes(data):
    assert tok.decode_bytes(tok.encode_bytes(data)) == data


def test_encode_multibyte_characters_are_several_tokens():
    ids = tok.encode("é€𝄞")
    assert ids == list("é€𝄞".encode("utf-8")) and len(ids) == 2 + 3 + 4


def test_decode_drops_specials():
    assert tok.decode([BOS, *tok.encode("hi"), EOS]) == "hi"
    assert tok.encode("hi", bos=True)[0] == BOS


def test_decode_invalid_utf8_is_replaced_not_raised():
    assert tok.decode([0xE2, 0x82]) == "\ufffd"


def test_decode_rejects_out_of_vocab():
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([VOCAB_SIZE])


def test_encode_rejects_non_str():
    with pytest.raises(TypeError):
        tok.encode(b"bytes")
