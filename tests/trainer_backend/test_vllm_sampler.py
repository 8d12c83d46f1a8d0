"""`--sampler vllm`: a real vLLM server (the CPU build, in its own environment) samples for the backend, and answers
as the built-in engine answers: greedy tokens and logprobs, prompt logprobs, trained adapters (two in one batch),
seeds, stop tokens and strings; a killed vLLM is started again and only the request it cut off fails. vLLM's
environment: tests/support/vllm.py.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import tinker
from support.backends import TINY, tiny_server_config
from support.trained_adapters import trained_adapter
from support.trainer import LOGPROB_ROUNDING, SQL, next_token_datum, status_of
from support.vllm import NEEDS_VLLM, VLLM_PYTHON
from support.weight_checks import checked, refused, train_steps
from tinker import types

from trainer_backend.checkpoints import CheckpointPath
from trainer_backend.config import ServerConfig
from trainer_backend.engine.types import SamplingRequest
from trainer_backend.models.gemma import GEMMA_3_270M
from trainer_backend.models.qwen import QWEN_2_5_CODER_0_5B_INSTRUCT
from trainer_backend.samplers import vllm_client
from trainer_backend.server import RunningServer, running_server

pytestmark = NEEDS_VLLM
KEY = "tml-vllm-tests"
GREEDY = types.SamplingParams(max_tokens=10, temperature=0.0)


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = tiny_server_config(tmp_path_factory.mktemp("vllm"), sampler="vllm", vllm_python=VLLM_PYTHON)
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def on_vllm(vllm_server: RunningServer) -> Iterator[tinker.ServiceClient]:
    with tinker.ServiceClient(base_url=vllm_server.url, api_key=KEY) as client:
        yield client


@pytest.fixture(scope="module")
def on_builtin(server: RunningServer) -> Iterator[tinker.ServiceClient]:
    """The session's server with the built-in engine, the reference."""
    with tinker.ServiceClient(base_url=server.url, api_key=KEY) as client:
        yield client


def trained_sampler(client: tinker.ServiceClient, seed: int, text: str) -> tinker.SamplingClient:
    """Sampler weights of a few large steps on `text`: the same on both servers for the same seed and text."""
    training = trained_adapter(client, text, seed=seed, steps=3, train_unembed=False)
    return training.save_weights_and_get_sampling_client().result(timeout=60)


def prompt_of(client: tinker.ServiceClient, text: str = SQL) -> types.ModelInput:
    tokenizer = (
        client.create_lora_training_client(base_model=TINY, rank=1, train_unembed=False).result().get_tokenizer()
    )
    return types.ModelInput.from_ints(tokenizer.encode(text)[:6])


def live_processes_of_group(group: int) -> list[int]:
    """Processes of a process group that are not zombies (this container's init may never reap them)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            alive.append(int(stat.parent.name))
    return alive


def assert_same(one: types.SampleResponse, other: types.SampleResponse) -> None:
    assert [s.tokens for s in one.sequences] == [s.tokens for s in other.sequences]
    assert [s.stop_reason for s in one.sequences] == [s.stop_reason for s in other.sequences]
    for sequence, reference in zip(one.sequences, other.sequences, strict=True):
        assert sequence.logprobs == pytest.approx(reference.logprobs, abs=LOGPROB_ROUNDING)


def test_greedy_samples_and_prompt_logprobs_are_the_builtin_engines(
    on_vllm: tinker.ServiceClient, on_builtin: tinker.ServiceClient
) -> None:
    prompt = prompt_of(on_vllm)
    answers = []
    for client in (on_vllm, on_builtin):
        sampler = client.create_sampling_client(base_model=TINY).result()
        answers.append(sampler.sample(prompt, 2, GREEDY, include_prompt_logprobs=True).result(timeout=120))
    assert_same(*answers)
    assert answers[0].prompt_logprobs == pytest.approx(answers[1].prompt_logprobs, abs=LOGPROB_ROUNDING)
    scores = [
        c.create_sampling_client(base_model=TINY).result().compute_logprobs(prompt).result()
        for c in (on_vllm, on_builtin)
    ]
    assert scores[0] == pytest.approx(scores[1], abs=LOGPROB_ROUNDING)


def test_trained_adapters_in_one_batch_each_answer_as_on_the_builtin_engine(
    on_vllm: tinker.ServiceClient, on_builtin: tinker.ServiceClient
) -> None:
    prompt = prompt_of(on_vllm)
    texts = {1: SQL, 2: "SELECT COUNT(*) FROM orders WHERE total > 10;"}
    answers = {}
    for name, client in (("vllm", on_vllm), ("builtin", on_builtin)):
        samplers = [trained_sampler(client, seed, text) for seed, text in texts.items()]
        with ThreadPoolExecutor(len(samplers)) as pool:  # at once: one vLLM batch holds both adapters
            futures = [pool.submit(lambda s: s.sample(prompt, 1, GREEDY).result(timeout=120), s) for s in samplers]
            answers[name] = [future.result() for future in futures]
    base = on_vllm.create_sampling_client(base_model=TINY).result().sample(prompt, 1, GREEDY).result(timeout=120)
    for from_vllm, from_builtin in zip(answers["vllm"], answers["builtin"], strict=True):
        assert_same(from_vllm, from_builtin)
    assert answers["vllm"][0].sequences[0].tokens != answers["vllm"][1].sequences[0].tokens
    assert base.sequences[0].tokens not in [a.sequences[0].tokens for a in answers["vllm"]]


def test_seeded_samples_repeat_and_their_logprobs_are_the_trainers(on_vllm: tinker.ServiceClient) -> None:
    sampler = on_vllm.create_sampling_client(base_model=TINY).result()
    prompt = prompt_of(on_vllm)
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=11)
    first = sampler.sample(prompt, 3, params).result(timeout=120)
    assert [s.tokens for s in first.sequences] == [
        s.tokens for s in sampler.sample(prompt, 3, params).result(timeout=120).sequences
    ]
    other_seed = types.SamplingParams(max_tokens=12, temperature=1.0, seed=12)
    assert first.sequences != sampler.sample(prompt, 3, other_seed).result(timeout=120).sequences
    # At temperature 1 the distribution sampled from is the model's: the trainer's forward scores the same tokens.
    training = on_vllm.create_lora_training_client(base_model=TINY, rank=1, train_unembed=False).result()
    for sequence in first.sequences:
        ids = prompt.to_ints() + list(sequence.tokens)
        output = training.forward([next_token_datum(ids)], "cross_entropy").result(timeout=60)
        trainer = output.loss_fn_outputs[0]["logprobs"].tolist()[-len(sequence.tokens) :]
        assert sequence.logprobs == pytest.approx(trainer, abs=LOGPROB_ROUNDING)


def test_stop_tokens_and_strings_end_where_the_builtin_engine_ends(
    on_vllm: tinker.ServiceClient, on_builtin: tinker.ServiceClient
) -> None:
    prompt = prompt_of(on_builtin)
    tokenizer = on_builtin.create_lora_training_client(base_model=TINY, rank=1).result().get_tokenizer()
    free = on_builtin.create_sampling_client(base_model=TINY).result().sample(prompt, 1, GREEDY).result(timeout=120)
    third = free.sequences[0].tokens[2]
    for stop in ([third], tokenizer.decode([third]), []):
        params = types.SamplingParams(max_tokens=10, temperature=0.0, stop=stop)
        answers = [
            c.create_sampling_client(base_model=TINY).result().sample(prompt, 1, params) for c in (on_vllm, on_builtin)
        ]
        assert_same(*(a.result(timeout=120) for a in answers))


def test_an_adapter_that_trains_the_unembedding_samples_through_the_builtin_engine(
    vllm_server: RunningServer, on_vllm: tinker.ServiceClient, on_builtin: tinker.ServiceClient
) -> None:
    """The SDK's default LoRA trains the unembedding, which vLLM cannot load: its sampler weights are served by the
    built-in engine of the same server, answering as the built-in server does, and the status and /metrics say so."""
    before = status_of(vllm_server, KEY)["sampler"]
    answers = []
    for client in (on_vllm, on_builtin):
        training = trained_adapter(client, SQL, seed=5, steps=2, rank=2)  # train_unembed=True
        sampler = training.save_weights_and_get_sampling_client().result()
        answers.append(sampler.sample(prompt_of(client), 2, GREEDY).result(timeout=120))
    assert_same(*answers)
    after = status_of(vllm_server, KEY)["sampler"]
    reason = "the adapter trains the unembedding (a LoRA on lm_head, which vLLM cannot load)"
    assert after["builtin_requests"].get(reason, 0) == before["builtin_requests"].get(reason, 0) + 1
    assert after["requests"] == before["requests"]
    metrics = httpx.get(f"{vllm_server.url}/metrics", timeout=10).text
    assert f'trainer_vllm_builtin_requests_total{{reason="{reason}"}}' in metrics


def test_a_killed_vllm_is_started_again_and_nothing_but_the_request_it_cut_off_is_lost(
    vllm_server: RunningServer, on_vllm: tinker.ServiceClient
) -> None:
    sampler = trained_sampler(on_vllm, 3, SQL)
    prompt = prompt_of(on_vllm)
    before = sampler.sample(prompt, 1, GREEDY).result(timeout=120)
    # Long enough to be in vLLM when it dies: 32 samples of up to nearly the whole context (the SDK does not send an
    # empty stop list, so EOS may end each; the longest of 32 runs far).
    long = sampler.sample(prompt, 32, types.SamplingParams(max_tokens=2000, temperature=1.0))
    deadline = time.monotonic() + 60
    while status_of(vllm_server, KEY)["sampler"]["in_flight"] == 0:
        assert not long.done(), f"the long request ended before vLLM was killed: {long.exception() or 'answered'}"
        assert time.monotonic() < deadline, "the long request never reached vLLM"
        time.sleep(0.05)
    time.sleep(0.5)  # from the pool's thread into vLLM

    crashed = vllm_server.service.sampler.preferred.client.process.process
    crashed.kill()  # the API server alone, as a crash leaves it: its engine processes live on
    crashed.wait()
    # Sent while vLLM is down or restarting: it waits for the restart (its adapter loads again), and is answered.
    after = sampler.sample(prompt, 1, GREEDY)
    # The request in flight fails by name, or (when it had not reached vLLM yet) is sent again once vLLM is back.
    try:
        assert len(long.result(timeout=300).sequences) == 32
    except tinker.RequestFailedError as error:
        assert "vLLM stopped answering during this request" in str(error)
    assert_same(after.result(timeout=300), before)
    assert live_processes_of_group(crashed.pid) == [], "the crashed server's engine processes were left running"
    sampler_status = status_of(vllm_server, KEY)["sampler"]
    assert sampler_status["engine"] == "vllm" and sampler_status["restarts"] == 1 and sampler_status["in_flight"] == 0


def test_weights_saved_again_under_one_name_are_served_by_vllm_as_saved(
    vllm_server: RunningServer, on_vllm: tinker.ServiceClient
) -> None:
    """vLLM keys its prefix cache by adapter name and path: weights saved again under one checkpoint name, loaded
    under the same adapter name, answered a prompt longer than one KV block (128 tokens on the CPU build) with the
    old weights' blocks. Named by their content, the new weights answer as the built-in engine answers them."""
    training = trained_adapter(on_vllm, SQL, seed=11, steps=3, train_unembed=False)
    tokenizer = training.get_tokenizer()
    prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 20)[:200]
    path = training.save_weights_for_sampler("again").result().path
    sampler = on_vllm.create_sampling_client(model_path=path).result()
    first = sampler.sample(types.ModelInput.from_ints(prompt), 1, GREEDY).result(timeout=120)
    train_steps(training, "SELECT name FROM employees;", steps=3)
    assert training.save_weights_for_sampler("again").result().path == path
    again = sampler.sample(types.ModelInput.from_ints(prompt), 1, GREEDY).result(timeout=120)
    folder = vllm_server.service.checkpoints.folder(CheckpointPath.parse(path))
    reference = vllm_server.service.engine.sample(
        SamplingRequest(tuple(prompt), max_tokens=GREEDY.max_tokens, temperature=0.0, weights_folder=folder)
    )
    assert list(again.sequences[0].tokens) == list(reference.sequences[0].tokens) != list(first.sequences[0].tokens)


def test_a_normal_load_into_vllm_passes_and_is_counted(
    vllm_server: RunningServer, on_vllm: tinker.ServiceClient
) -> None:
    before = checked(vllm_server, "vllm")
    training = trained_adapter(on_vllm, SQL, seed=12, steps=2, train_unembed=False)
    sampler = training.save_weights_and_get_sampling_client().result(timeout=60)
    assert checked(vllm_server, "vllm") == before + 1  # loaded and checked before the save's future resolved
    assert sampler.sample(prompt_of(on_vllm), 1, GREEDY).result(timeout=120).sequences[0].tokens
    assert checked(vllm_server, "vllm") == before + 1


def test_weights_vllm_does_not_apply_are_refused(
    vllm_server: RunningServer, on_vllm: tinker.ServiceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fault, at the narrowest point: every request to vLLM names the base model, not the adapter loaded."""
    original = vllm_client._completion_body
    monkeypatch.setattr(vllm_client, "_completion_body", lambda request, model: original(request, TINY))
    before = refused(vllm_server, "vllm", "no_effect")
    training = trained_adapter(on_vllm, SQL, seed=13, steps=2, train_unembed=False)
    path = training.save_weights_for_sampler("not-applied").result().path  # the save stands; its load is refused
    assert refused(vllm_server, "vllm", "no_effect") == before + 1
    with pytest.raises(tinker.RequestFailedError, match="change nothing"):
        on_vllm.create_sampling_client(model_path=path).result().sample(prompt_of(on_vllm), 1, GREEDY).result(
            timeout=120
        )
    assert refused(vllm_server, "vllm", "no_effect") == before + 2


def test_the_previous_version_loaded_into_vllm_is_refused(
    vllm_server: RunningServer, on_vllm: tinker.ServiceClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The fault, at the narrowest point: vLLM is asked to load the folder's previous version. The file at the
    folder hashes right; vLLM's answers on the probe give it away."""
    training = trained_adapter(on_vllm, SQL, seed=14, steps=2, train_unembed=False)
    path = training.save_weights_for_sampler("versions").result().path
    previous = shutil.copytree(vllm_server.service.checkpoints.folder(CheckpointPath.parse(path)), tmp_path / "v1")
    client = vllm_server.service.sampler.preferred.client
    post = client._post

    def load_previous(route: str, body: dict, what: str, missing_ok: bool = False) -> None:
        if route == "/v1/load_lora_adapter":
            body = {**body, "lora_path": str(previous)}
        post(route, body, what, missing_ok)

    monkeypatch.setattr(client, "_post", load_previous)
    train_steps(training, "SELECT name FROM employees;", steps=2)
    before = refused(vllm_server, "vllm", "probe_mismatch")
    training.save_weights_for_sampler("versions").result()
    assert refused(vllm_server, "vllm", "probe_mismatch") == before + 1
    with pytest.raises(tinker.RequestFailedError, match="unlike the weights saved"):
        on_vllm.create_sampling_client(model_path=path).result().sample(prompt_of(on_vllm), 1, GREEDY).result(
            timeout=120
        )


def test_an_adapter_cache_on_vllm_that_returns_the_old_weights_is_refused(
    vllm_server: RunningServer, on_vllm: tinker.ServiceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saved again under one name, weights are other weights that vLLM must load; the fault, at the narrowest point,
    names adapters by their folder alone, so vLLM's adapter of the old weights answers for the new. A training
    checkpoint sampled from is not loaded ahead at its save: the next request finds the stale adapter."""
    monkeypatch.setattr(vllm_client, "adapter_name", lambda folder, _: str(folder))
    training = trained_adapter(on_vllm, SQL, seed=15, steps=2, train_unembed=False)
    path = training.save_state("cached").result().path
    sampler = on_vllm.create_sampling_client(model_path=path).result()
    sampler.sample(prompt_of(on_vllm), 1, GREEDY).result(timeout=120)
    train_steps(training, "SELECT name FROM employees;", steps=2)
    assert training.save_state("cached").result().path == path
    before = refused(vllm_server, "vllm", "stale_cache")
    with pytest.raises(tinker.RequestFailedError, match="is stale"):
        sampler.sample(prompt_of(on_vllm), 1, GREEDY).result(timeout=120)
    assert refused(vllm_server, "vllm", "stale_cache") == before + 1
    assert sampler.sample(prompt_of(on_vllm), 1, GREEDY).result(timeout=120).sequences  # loaded afresh


SETTINGS_SCHEMA = {
    "type": "object",
    "properties": {"rank": {"type": "integer", "minimum": 1, "maximum": 64}, "loss": {"enum": ["ppo", "dro"]}},
    "required": ["rank", "loss"],
    "additionalProperties": False,
}


def test_structured_output_through_vllm_follows_the_schema_as_the_builtin_engine_does(
    vllm_server: RunningServer, server: RunningServer
) -> None:
    """Both engines mask with llguidance, compactly: greedy answers under a JSON schema are the same text, with the
    same logprobs (those of the constrained distribution), and parse and validate."""
    import openai

    answers = []
    for running in (vllm_server, server):
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key=KEY, max_retries=0)
        answers.append(
            client.completions.create(
                model=TINY,
                prompt=SQL,
                max_tokens=30,
                temperature=0,
                logprobs=0,
                extra_body={"response_format": {"type": "json_schema", "json_schema": {"schema": SETTINGS_SCHEMA}}},
            ).choices[0]
        )
    on_vllm, on_builtin = answers
    assert on_vllm.finish_reason == "stop", on_vllm.text
    settings = json.loads(on_vllm.text)
    assert set(settings) == {"rank", "loss"} and 1 <= settings["rank"] <= 64 and settings["loss"] in ("ppo", "dro")
    assert on_vllm.text == on_builtin.text
    assert on_vllm.logprobs.token_logprobs == pytest.approx(on_builtin.logprobs.token_logprobs, abs=LOGPROB_ROUNDING)


@pytest.mark.parametrize("base_model", [GEMMA_3_270M, QWEN_2_5_CODER_0_5B_INSTRUCT])
def test_real_models_greedy_tokens_through_vllm_are_the_builtin_engines(base_model: str, tmp_path: Path) -> None:
    """The real Gemma 3 270M and Qwen2.5-Coder-0.5B-Instruct (vLLM loads the converted folder): vLLM's greedy tokens
    and logprobs, of the base model and of a trained adapter, against the built-in engine of the same server (the
    trainer's own model, which --sampler vllm leaves to training)."""
    config = ServerConfig(
        base_model=base_model, device="cpu", storage_root=tmp_path, port=0, sampler="vllm", vllm_python=VLLM_PYTHON
    )
    with running_server(config) as server, tinker.ServiceClient(base_url=server.url, api_key=KEY) as client:
        berlin = "SELECT COUNT(*) FROM customers WHERE city = 'Berlin';"
        training = trained_adapter(
            client,
            berlin,
            seed=0,
            steps=2,
            rank=8,
            learning_rate=1e-3,
            train_unembed=False,
            weighted=True,
            base_model=base_model,
        )
        tokenizer = training.get_tokenizer()
        trained_path = training.save_weights_for_sampler("trained").result().path
        prompt = tokenizer.encode("The Eiffel Tower is located in the city of")
        for path in (None, trained_path):
            sampler = (
                client.create_sampling_client(model_path=path).result()
                if path
                else client.create_sampling_client(base_model=base_model).result()
            )
            answer = sampler.sample(types.ModelInput.from_ints(prompt), 1, GREEDY).result(timeout=300).sequences[0]
            folder = None if path is None else server.service.checkpoints.folder(CheckpointPath.parse(path))
            reference = server.service.engine.sample(
                SamplingRequest(tuple(prompt), max_tokens=GREEDY.max_tokens, temperature=0.0, weights_folder=folder)
            ).sequences[0]
            assert list(answer.tokens) == list(reference.tokens)
            assert answer.logprobs == pytest.approx(reference.logprobs, abs=LOGPROB_ROUNDING)
