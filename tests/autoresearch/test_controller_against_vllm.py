"""The controller's LLM is a second real server: vLLM's own OpenAI endpoint (the CPU build, its own environment) on
the tiny model, with a chat template given, answering proposals under the proposal's JSON schema with vLLM's
structured output. As with the backend's own /v1 (test_controller.py; both run tests/support/studies.py's study),
every reply follows the schema, each candidate is judged against the search space, and the study finishes its
budget."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from support.backends import GEMMA_CHAT_TEMPLATE, REPOSITORY, TINY
from support.studies import run_study_with_a_real_llm
from support.vllm import NEEDS_VLLM, VLLM_PYTHON

from autoresearch.proposer import proposal_model
from autoresearch.spec import load_study_spec
from trainer_backend.models.registry import default_cache_root, resolve_base_model
from trainer_backend.samplers.vllm_process import VllmProcess, VllmSettings

pytestmark = NEEDS_VLLM
# The tiny model's context (2048) holds the proposal prompt (about 820 tokens) and this many more.
MAX_TOKENS = 1024


class ChatServingVllm(VllmProcess):
    """The backend's vLLM process (structured output through llguidance, as k8s/overlays/gke-llm's), with the chat
    template its chat endpoint needs: the tiny model has none."""

    def command(self) -> list[str]:
        return [*super().command(), "--chat-template", str(GEMMA_CHAT_TEMPLATE)]


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = resolve_base_model(TINY, default_cache_root()).folder
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    process = ChatServingVllm(VllmSettings(folder, TINY, python=Path(str(VLLM_PYTHON)), log_path=log_path))
    process.start()
    try:
        yield process.url
    finally:
        process.stop()


def test_vllms_replies_under_the_proposal_schema_parse_as_proposals(vllm_url: str) -> None:
    """The random model writes long random strings, so some replies run out of tokens; every one that ends, parses."""
    client = openai.OpenAI(base_url=f"{vllm_url}/v1", api_key="unused")
    proposal = proposal_model(load_study_spec(REPOSITORY / "experiments" / "text2sql_tiny.yaml"))
    reply = client.chat.completions.create(
        model=TINY,
        messages=[{"role": "user", "content": "Propose two candidates."}],
        n=8,
        max_tokens=MAX_TOKENS,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "Proposal", "schema": proposal.model_json_schema(), "strict": True},
        },
    )
    ended = [choice.message.content for choice in reply.choices if choice.finish_reason == "stop"]
    assert ended, [choice.finish_reason for choice in reply.choices]
    for content in ended:
        assert proposal.model_validate_json(content).candidates


def test_a_study_whose_llm_is_vllms_own_endpoint_under_a_json_schema_finishes_its_budget(
    vllm_url: str, backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_study_with_a_real_llm(vllm_url, backend_url, tmp_path, monkeypatch, MAX_TOKENS)
