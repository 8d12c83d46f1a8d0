"""A stream's text, token by token (`IncrementalText`): what it sends adds up to the whole decode, with any stop
string and what follows it held back, however the tokens split characters (byte-fallback pieces of multi-byte
characters, tokens that drop a leading space at the start of a decode)."""

from __future__ import annotations

import random

import pytest
from support.backends import TINY
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from trainer_backend.models.registry import default_cache_root, resolve_base_model
from trainer_backend.openai_service import IncrementalText

TEXTS = [
    "SELECT name FROM employees WHERE salary > 50000;",
    "Ünïcödé — “quotes”, 日本語のテキスト, emoji 🙂🚀 and spaces   inside.",
    "  leading spaces\nnew lines\n\n\ttabs",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(resolve_base_model(TINY, default_cache_root()).folder)


def streamed(tokenizer: PreTrainedTokenizerBase, tokens: list[int], stops: tuple[str, ...] = ()) -> str:
    text = IncrementalText(tokenizer, stops)
    return "".join(text.add(token) for token in tokens)


@pytest.mark.parametrize("text", TEXTS)
def test_the_sent_text_adds_up_to_the_whole_decode(tokenizer: PreTrainedTokenizerBase, text: str) -> None:
    tokens = tokenizer.encode(text, add_special_tokens=False)
    assert streamed(tokenizer, tokens) == tokenizer.decode(tokens, skip_special_tokens=True)


def test_random_tokens_add_up_to_their_decode(tokenizer: PreTrainedTokenizerBase) -> None:
    draw = random.Random(0)
    for _ in range(20):
        tokens = [draw.randrange(len(tokenizer)) for _ in range(40)]
        whole = tokenizer.decode(tokens, skip_special_tokens=True)
        incremental = IncrementalText(tokenizer, ())
        sent = "".join(incremental.add(token) for token in tokens)
        assert whole.startswith(sent) and sent + incremental.rest(whole) == whole


@pytest.mark.parametrize("stop", ["WHERE", ";", "50000;"])
def test_a_stop_string_and_what_follows_are_never_sent(tokenizer: PreTrainedTokenizerBase, stop: str) -> None:
    text = TEXTS[0] + " SELECT 1;"
    tokens = tokenizer.encode(text, add_special_tokens=False)
    assert streamed(tokenizer, tokens, (stop, "never there")) == text[: text.index(stop)]
