"""The OpenAI-compatible layer's cost: the same requests through Tinker's `sample` and through /v1/completions, and
/v1/completions with a JSON schema against without; and llguidance's time to compute one token mask.

Run: python -m benchmarks.openai_endpoint [--model gemma-3-270m] [--requests 4] [--max-tokens 48]

Each mode sends `--requests` requests at once (one prompt each, temperature 1, seeded) to one server and waits for
all; tokens/s is generated tokens over the wall time of the whole round. Prints one line per mode, then the median
microseconds llguidance takes to fill a token mask over the model's vocabulary while following the schema, and what
turning a long stream's tokens into text costs: `IncrementalText` against decoding the whole answer at each token.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import llguidance
import llguidance.hf
import llguidance.torch
import openai
import tinker
from tinker import types

from benchmarks import ROOT
from trainer_backend.config import ServerConfig
from trainer_backend.models.registry import GEMMA_3_270M
from trainer_backend.openai_service import IncrementalText
from trainer_backend.server import running_server
from trainer_backend.structured_output import COMPACT

KEY = "tml-openai-benchmark"
PROMPT = "Propose a learning rate and a loss for RL post-training of a small model, as JSON:"
SCHEMA = {
    "type": "object",
    "properties": {
        "learning_rate": {"type": "number"},
        "loss": {"enum": ["importance_sampling", "ppo", "dro"]},
        "rationale": {"type": "string", "maxLength": 120},
    },
    "required": ["learning_rate", "loss", "rationale"],
    "additionalProperties": False,
}


def timed_round(send, requests: int) -> tuple[float, int]:
    """Wall seconds for `requests` concurrent calls of `send(i)`, and the tokens they generated."""
    started = time.perf_counter()
    with ThreadPoolExecutor(requests) as pool:
        tokens = sum(pool.map(send, range(requests)))
    return time.perf_counter() - started, tokens


def mask_microseconds(tokenizer, steps: int = 200) -> float:
    """Median time to fill one token mask while a matcher follows SCHEMA, taking the first allowed token each step."""
    import json

    import torch

    lltokenizer = llguidance.hf.from_tokenizer(tokenizer)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), defaults=COMPACT)
    matcher = llguidance.LLMatcher(lltokenizer, grammar)
    bitmask = llguidance.torch.allocate_token_bitmask(1, lltokenizer.vocab_size)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        times.append(time.perf_counter() - started)
        bits = ((bitmask[0, :, None] >> torch.arange(32, dtype=torch.int32)) & 1).flatten().nonzero()
        matcher.consume_token(int(bits[-1]))
        if matcher.is_stopped():
            break
    return statistics.median(times) * 1e6


def stream_text_seconds(tokenizer, tokens: int = 2048) -> tuple[float, float]:
    """Seconds to turn a `tokens`-token answer (the documentation's pages, tokenized) into streamed text:
    IncrementalText, and the reference of decoding everything drawn so far at each token."""
    pages = "\n".join(page.read_text() for page in sorted((ROOT / "docs").glob("*.md")))
    ids = tokenizer.encode(pages, add_special_tokens=False)[:tokens]
    started = time.perf_counter()
    text = IncrementalText(tokenizer, ("\n\n\n",))
    for token in ids:
        text.add(token)
    incremental = time.perf_counter() - started
    started = time.perf_counter()
    for end in range(1, len(ids) + 1):
        tokenizer.decode(ids[:end], skip_special_tokens=True)
    return incremental, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=GEMMA_3_270M)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()

    storage = Path(tempfile.mkdtemp(prefix="openai-benchmark-"))
    config = ServerConfig(base_model=args.model, device="cpu", storage_root=storage, port=0, api_keys=[KEY])
    with running_server(config) as server, tinker.ServiceClient(base_url=server.url, api_key=KEY) as client:
        sampler = client.create_sampling_client(base_model=args.model).result()
        tokenizer = server.service.loaded.tokenizer
        prompt = types.ModelInput.from_ints(tokenizer.encode(PROMPT))
        oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=600)

        def tinker_sample(i: int) -> int:
            params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=i)
            result = sampler.sample(prompt=prompt, num_samples=1, sampling_params=params).result()
            return len(result.sequences[0].tokens)

        def completion(i: int, schema: bool = False) -> int:
            extra = {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}} if schema else {}
            answer = oai.completions.create(
                model=args.model, prompt=PROMPT, max_tokens=args.max_tokens, temperature=1.0, seed=i, extra_body=extra
            )
            return answer.usage.completion_tokens

        modes = {
            "tinker sample": tinker_sample,
            "/v1/completions": completion,
            "/v1/completions + json_schema": lambda i: completion(i, schema=True),
        }
        timed_round(tinker_sample, 1)  # warm-up: the first generation pays one-off costs
        print(f"{args.model}, {args.requests} concurrent requests of at most {args.max_tokens} tokens, CPU:")
        for name, send in modes.items():
            seconds, tokens = timed_round(send, args.requests)
            print(f"  {name:32s} {tokens:5d} tokens in {seconds:6.1f} s = {tokens / seconds:6.1f} tokens/s")
        print(f"llguidance token mask over {len(tokenizer)} tokens: median {mask_microseconds(tokenizer):.0f} us")
        incremental, whole = stream_text_seconds(tokenizer)
        print(f"text of a 2,048-token stream: {incremental * 1e3:.0f} ms; {whole * 1e3:.0f} ms decoding it whole")


if __name__ == "__main__":
    main()
