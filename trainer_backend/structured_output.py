"""Structured output: a JSON schema (or "any JSON object") compiled by llguidance into per-sequence token constraints.

llguidance was chosen over xgrammar and outlines-core because it installs alone (no torch or triton pins of its own,
which the torch 2.13.0 CPU pin cannot afford) and computes a token mask in microseconds on Gemma's 262k vocabulary
(`python -m benchmarks.openai_endpoint`). Output is compact (no whitespace between tokens of JSON), so a small
model cannot spend its budget on blank space.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf
import llguidance.torch
import torch
from transformers import PreTrainedTokenizerBase

from trainer_backend.engine.types import TokenConstraint
from trainer_backend.errors import UserInputError

log = logging.getLogger(__name__)

# No whitespace between JSON tokens; separators as json.dumps writes them compactly.
COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


class JsonSchemaConstraints:
    """Makes constraints for one tokenizer and a logits width (which may exceed the tokenizer's length)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> None:
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer)
        self.vocab_size = vocab_size

    def for_schema(self, schema: dict[str, Any] | None, where: str) -> JsonSchemaConstraint:
        """A factory of constraints to `schema` (None: any JSON object), one per sampled sequence.

        Raises:
            UserInputError: the schema is not one llguidance can compile; the message names `where` and why.
        """
        schema = ANY_OBJECT if schema is None else schema
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=COMPACT)
        problem = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if problem and not problem.startswith("WARNING"):
            raise UserInputError(f"{where} is not a JSON schema this server can follow: {problem}")
        return JsonSchemaConstraint(schema, grammar, self.tokenizer, self.vocab_size)

    def remade(self, sent: SentGrammar) -> JsonSchemaConstraint:
        """The constraint another process of a sharded backend made and validated, made here with this process's
        tokenizer (the same model's: the same token masks)."""
        return JsonSchemaConstraint(sent.schema, sent.grammar, self.tokenizer, self.vocab_size)


@dataclass(frozen=True)
class SentGrammar:
    """A constraint as text, to send to another process: a compiled matcher and its tokenizer cannot be."""

    schema: dict[str, Any]
    grammar: str


@dataclass(frozen=True)
class JsonSchemaConstraint:
    """Output that follows one JSON schema: called, a fresh constraint for one sequence (the built-in engine draws
    through it); `schema` is for an engine that compiles its own (vLLM, with llguidance too)."""

    schema: dict[str, Any]
    grammar: str
    tokenizer: llguidance.LLTokenizer
    vocab_size: int

    def __call__(self) -> TokenConstraint:
        return _MatcherConstraint(llguidance.LLMatcher(self.tokenizer, self.grammar), self.tokenizer, self.vocab_size)

    def sent(self) -> SentGrammar:
        return SentGrammar(self.schema, self.grammar)


class _MatcherConstraint:
    """One sequence's llguidance matcher; its bit mask unpacked to the logits' width."""

    def __init__(self, matcher: llguidance.LLMatcher, tokenizer: llguidance.LLTokenizer, vocab_size: int) -> None:
        self.matcher = matcher
        self.eos_token = tokenizer.eos_token
        self.vocab_size = vocab_size
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, tokenizer.vocab_size)
        self._bits = torch.arange(32, dtype=torch.int32)

    def allowed(self) -> torch.Tensor:
        allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
        if self.matcher.is_error():
            # Not expected of a grammar that validated; if it happens, the sequence ends at once, by EOS.
            log.error("structured output matcher failed: %s", self.matcher.get_error())
            allowed[self.eos_token] = True
            return allowed
        llguidance.torch.fill_next_token_bitmask(self.matcher, self.bitmask, 0)
        unpacked = ((self.bitmask[0, :, None] >> self._bits) & 1).bool().flatten()
        width = min(len(unpacked), self.vocab_size)
        allowed[:width] = unpacked[:width]
        return allowed

    def advance(self, token: int) -> None:
        self.matcher.consume_token(token)

    def finished(self) -> bool:
        return self.matcher.is_stopped() or self.matcher.is_error()
