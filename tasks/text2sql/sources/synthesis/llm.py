"""The question-writing LLM: any OpenAI-compatible `/v1/chat/completions`, spoken to with many requests in flight so a
batching server (the project's backend) answers them together.

By default it is the project's own backend serving Qwen2.5-Coder-0.5B-Instruct on this machine. Every way the
endpoint can fail becomes an `LlmUnavailableError` that says what to do.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass

import httpx

from tasks.text2sql.sources.synthesis.errors import LlmUnavailableError

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
DEFAULT_MODEL = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
START_BACKEND = f"python -m trainer_backend serve --base-model {DEFAULT_MODEL}"
# Statuses that mean "later": the backend's queue is full, or a proxy is restarting.
_RETRY_STATUSES = frozenset({429, 502, 503, 504})
_RETRIES = 5
# How OpenAI, vLLM and this project's backend word a request longer than the model's context.
_TOO_LONG = re.compile(r"context[ _]length|maximum context|too long", re.IGNORECASE)


class PromptTooLongError(Exception):
    """This one request does not fit the model's context: a verdict on the item, not a failure of the endpoint."""


@dataclass(frozen=True)
class LlmConfig:
    """Where the LLM is and how hard to push it."""

    base_url: str = DEFAULT_BASE_URL
    # Part of every cache key, so named rather than discovered: a cached build needs no endpoint at all.
    model: str = DEFAULT_MODEL
    # The environment variable holding the API key; unset means no key (the local backend needs none).
    api_key_env: str = "OPENAI_API_KEY"
    # Requests in flight: the backend batches up to 64 rows per generation step.
    concurrency: int = 16
    # One answer may wait behind a whole batch on a CPU.
    timeout_s: float = 900.0
    question_tokens: int = 96
    sql_tokens: int = 320
    # Times SQL that fails to run goes back with the error for a corrected query.
    repairs: int = 1


class ChatClient:
    """An async client of one endpoint and model; use as `async with ChatClient(config) as client`."""

    def __init__(self, config: LlmConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        headers = {}
        if key := os.environ.get(config.api_key_env):
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.AsyncClient(
            base_url=config.base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(config.timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=config.concurrency),
            transport=transport,
        )
        self._slots = asyncio.Semaphore(config.concurrency)
        self.model = config.model

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._client.aclose()

    async def check_endpoint(self) -> None:
        """Fail early, with the fix, when the endpoint is down, refuses the key, or does not serve the model."""
        try:
            response = await self._client.get("/models")
        except httpx.TransportError as error:
            raise self._unreachable(error) from None
        if response.status_code in (401, 403):
            raise self._refused(response)
        if response.status_code != 200:
            return  # not every OpenAI-compatible server lists its models; the first request will tell
        try:
            listed = [card["id"] for card in response.json()["data"]]
        except (ValueError, KeyError, TypeError):
            return
        if listed and self.model not in listed:
            raise LlmUnavailableError(
                f"{self.config.base_url} does not serve model {self.model!r}; it serves {', '.join(listed)}: "
                "pass one of those with --model"
            )

    async def chat(self, messages: list[dict[str, str]], max_tokens: int) -> str:
        """The assistant's reply to `messages`, greedy.

        Raises:
            PromptTooLongError: the request exceeds the model's context.
            LlmUnavailableError: the endpoint fails otherwise.
        """
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
        async with self._slots:
            for attempt in range(_RETRIES + 1):
                try:
                    response = await self._client.post("/chat/completions", json=body)
                except httpx.TimeoutException:
                    raise LlmUnavailableError(
                        f"{self.config.base_url} gave no answer within {self.config.timeout_s:g} s; lower "
                        "--concurrency or raise --timeout-s"
                    ) from None
                except httpx.TransportError as error:
                    raise self._unreachable(error) from None
                if response.status_code in _RETRY_STATUSES and attempt < _RETRIES:
                    await asyncio.sleep(min(30.0, 2.0**attempt))
                    continue
                break
        if response.status_code in (401, 403):
            raise self._refused(response)
        if response.status_code == 400 and _TOO_LONG.search(_message(response)):
            raise PromptTooLongError(_message(response))
        if response.status_code != 200:
            raise LlmUnavailableError(
                f"{self.config.base_url}/chat/completions answered {response.status_code}: {_message(response)}; "
                "check --base-url (it ends in /v1) and --model"
            )
        try:
            return response.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            raise LlmUnavailableError(
                f"{self.config.base_url} answered with something that is not a chat completion: "
                f"{response.text[:200]!r}; point --base-url at an OpenAI-compatible /v1"
            ) from None

    def _unreachable(self, error: Exception) -> LlmUnavailableError:
        return LlmUnavailableError(
            f"cannot reach the question-writing LLM at {self.config.base_url} ({type(error).__name__}: {error}); "
            f"start the project's backend with `{START_BACKEND}`, or pass --base-url (and --model) for another "
            "OpenAI-compatible endpoint"
        )

    def _refused(self, response: httpx.Response) -> LlmUnavailableError:
        return LlmUnavailableError(
            f"{self.config.base_url} refused the request ({response.status_code}: {_message(response)}); put the "
            f"API key in ${self.config.api_key_env}, or name the variable that holds it with --api-key-env"
        )


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        return (error.get("message") if isinstance(error, dict) else str(error or response.json()))[:300]
    except (ValueError, AttributeError):
        return response.text[:300]
