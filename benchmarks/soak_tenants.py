"""The soak's tenants (benchmarks/soak.py), each on an API key of its own, and what became of every request it sent.

- `rl_tenant`: small GRPO-style RL steps through the `tinker` SDK (sample a group per prompt with the weights the
  last step left, reward, forward_backward, optim_step), its state saved every few steps; when the backend goes away
  it resumes from its last saved state, as a trial does (autoresearch/trials/rl_loop.py).
- `evaluating_tenant`: `in_flight` requests at once to the backend's OpenAI-compatible /v1/completions, on the base
  model or on an adapter the tenant saved; connection errors are retried, as any client of a service that restarts
  does.
- `checkpoint_tenant`: saves a training state or sampler weights every `period_s`, samples from one of its saved
  sampler weights now and then, and deletes its oldest save whenever its key's storage quota refuses the next one.

Each request ends in one `Outcome`; a tenant's `TenantLog` keeps them with their times.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, TypeVar

import httpx
import tinker
from tinker import types

from autoresearch.trials.advantages import group_advantages
from autoresearch.trials.datums import rl_datum, supervised_datum

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Pending(Protocol[T_co]):
    """An SDK future (APIFuture and its kin)."""

    def result(self, timeout: float | None = None) -> T_co: ...


# How long one request may take before it counts as lost: a generation batch on Qwen behind other tenants' work
# takes minutes at worst on 2 cores.
REQUEST_TIMEOUT_S = 600.0
# How long a client goes on retrying connection errors before the request counts as lost: the backend's restart
# (Qwen's load included) takes well under this.
RETRY_FOR_S = 300.0
RETRY_PAUSE_S = 0.2
LORA_RANK = 8
LEARNING_RATE = 1e-5


class Deadline:
    """When the tenants stop: a moment that stands still while the soak has it paused (the backend's outage), so
    that a restart slowed by a busy machine neither ends the tenants while the backend is down nor eats the time they
    have to show they carried on."""

    def __init__(self, at: float) -> None:
        self.at = at
        self._paused_at: float | None = None

    def ahead(self) -> bool:
        return self._paused_at is not None or time.time() < self.at

    def pause(self) -> None:
        self._paused_at = time.time()

    def resume(self) -> None:
        if self._paused_at is not None:
            self.at += time.time() - self._paused_at
            self._paused_at = None


class Outcome(StrEnum):
    ANSWERED = "answered"
    REFUSED = "refused"  # a 4xx or a future failed as the caller's fault: an answer (a quota said no)
    CUT_OFF = "failed by the restart"  # the killed server's work, failed by name after the restart
    CONNECTION_ERROR = "connection error"  # the SDK gave up reaching the backend; the tenant goes on
    SERVER_ERROR = "5xx"  # a 5xx, or a future failed on the server's side for another reason
    LOST = "lost"  # no answer: timed out, or an error that is none of the above


@dataclass(frozen=True)
class Request:
    kind: str  # sample, forward_backward, completion, save_state, …
    sent: float  # wall clock, seconds
    ended: float
    outcome: Outcome
    tokens: int = 0  # completion tokens generated (evaluating tenants)
    error: str = ""

    @property
    def seconds(self) -> float:
        return self.ended - self.sent


@dataclass(frozen=True)
class Resume:
    at: float  # wall clock
    from_step: int  # the step of the state it resumed from


@dataclass
class TenantLog:
    """What one tenant sent and how each request ended; the tenant's threads add to it, the soak reads it."""

    name: str
    role: str  # "rl", "eval-base", "eval-adapter", "checkpoints", "eval-alone"
    key: str
    requests: list[Request] = field(default_factory=list)
    connection_retries: int = 0  # connection errors a client retried (a /v1 request, a new SDK session)
    step: int = 0  # RL tenants: the step it stands at
    resumes: list[Resume] = field(default_factory=list)
    # RL tenants: (when it was asked for, step) of each state saved. When asked, not when answered: a save the killed
    # backend answered just before the kill is recorded by a thread that may run only after the kill's time is taken.
    saved_steps: list[tuple[float, int]] = field(default_factory=list)
    quota_refusals: int = 0  # checkpoint tenants: saves its storage quota refused
    crashed: str = ""  # the error that ended the tenant before its time, if one did
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def retried(self) -> None:
        with self._lock:
            self.connection_retries += 1

    def result(self, kind: str, future: Pending[T], sent: float | None = None) -> T:
        """The SDK future's result, its request recorded as answered; or its error, recorded by what it means,
        raised. `sent`: when the request was submitted, if before now."""
        sent = time.time() if sent is None else sent
        try:
            value = future.result(timeout=REQUEST_TIMEOUT_S)
        except Exception as error:
            self.add(Request(kind, sent, time.time(), outcome_of(error), error=f"{type(error).__name__}: {error}"))
            raise
        self.add(Request(kind, sent, time.time(), Outcome.ANSWERED))
        return value


def outcome_of(error: BaseException) -> Outcome:
    """What an SDK error says of the request: an answer, the restart's named failure, a connection given up, or lost."""
    # The backend names both: work it held when it was killed, and a run whose live weights died with it.
    if "server restarted" in str(error):
        return Outcome.CUT_OFF
    if isinstance(error, tinker.APIStatusError):
        return Outcome.SERVER_ERROR if error.status_code >= 500 else Outcome.REFUSED
    if isinstance(error, tinker.RequestFailedError):
        return Outcome.REFUSED if error.category is types.RequestErrorCategory.User else Outcome.SERVER_ERROR
    if isinstance(error, tinker.APIConnectionError):
        return Outcome.CONNECTION_ERROR
    return Outcome.LOST


def sessions(log: TenantLog, url: str, until: Deadline) -> Iterator[tuple[tinker.ServiceClient, tinker.RestClient]]:
    """SDK sessions for the tenant's key, with its REST client, until `until` passes: the next one once the caller is
    done with the last (the backend went away), each opened again and again while the backend cannot be reached."""
    while until.ahead():
        try:
            service = tinker.ServiceClient(base_url=url, api_key=log.key)
        except tinker.APIConnectionError:
            log.retried()
            time.sleep(RETRY_PAUSE_S)
            continue
        with service:
            yield service, tinker.RestClient(base_url=url, api_key=log.key)


@dataclass(frozen=True)
class RlShape:
    """One RL step of an RL tenant: `prompts` prompts × `group` completions of at most `max_tokens` tokens."""

    prompts: int
    group: int
    max_tokens: int
    checkpoint_every: int  # steps between saved states


def reward(tokens: list[int]) -> float:
    """The share of a completion's tokens with an even id: a spread within every group, nothing to learn. The soak
    measures the backend, not learning."""
    return sum(1 for token in tokens if token % 2 == 0) / max(1, len(tokens))


def rl_tenant(log: TenantLog, url: str, base_model: str, shape: RlShape, seed: int, until: Deadline) -> None:
    """RL steps until `until`; after an interruption, from the last saved state, in a new run. A run keeps its two
    newest states (`keep_checkpoints`), but a run left behind keeps its own: the tenant deletes them, all but the state
    it resumed from when it resumes, and that one once the new run has saved, or each restart would leave its key's
    storage quota a run's checkpoints fuller."""
    metadata = {"keep_checkpoints": "2"}
    checkpoint: tuple[int, str] | None = None  # (step, tinker path)
    left_behind: list[str] = []  # model ids of the tenant's runs it went on without
    current: str | None = None
    for service, rest in sessions(log, url, until):
        try:
            if checkpoint is None:
                created = service.create_lora_training_client(
                    base_model=base_model, rank=LORA_RANK, seed=seed, user_metadata=metadata
                )
                training = log.result("create", created)
                log.step = 0
                # A state at step 0 too: a tenant interrupted before its first checkpoint also resumes from one.
                asked = time.time()
                checkpoint = (0, log.result("save_state", training.save_state("step-00000"), asked).path)
                log.saved_steps.append((asked, 0))
            else:
                step, path = checkpoint
                loaded = service.create_training_client_from_state_with_optimizer(path, user_metadata=metadata)
                training = log.result("load_state", loaded)
                log.step = step
                log.resumes.append(Resume(time.time(), step))
                # What the runs left behind hold besides the state resumed from goes now, not after the new run's
                # first save: with it, that save can pass the key's quota, be refused on every try, and the tenant
                # would resume over and over, each time leaving one more run behind.
                for run in left_behind:
                    delete_checkpoints(log, rest, run, keeping=path)
            current = training.model_id
            tokenizer = training.get_tokenizer()
            while until.ahead():
                rl_step(log, training, tokenizer, shape)
                log.step += 1
                if log.step % shape.checkpoint_every == 0:
                    asked = time.time()
                    saved = log.result("save_state", training.save_state(f"step-{log.step:05d}"), asked)
                    checkpoint = (log.step, saved.path)
                    log.saved_steps.append((asked, log.step))
                    while left_behind:
                        delete_checkpoints(log, rest, left_behind[0])
                        left_behind.pop(0)
        except Exception:  # recorded by `result`: the backend went away; go on from the checkpoint in a new run
            if current is not None and current not in left_behind:
                left_behind.append(current)
            current = None
            time.sleep(RETRY_PAUSE_S)


def delete_checkpoints(log: TenantLog, rest: tinker.RestClient, run: str, keeping: str | None = None) -> None:
    """Delete every checkpoint of the tenant's run `run` but the one at the tinker path `keeping`."""
    for checkpoint in log.result("list", rest.list_checkpoints(run)).checkpoints:
        if checkpoint.tinker_path != keeping:
            log.result("delete", rest.delete_checkpoint_from_tinker_path(checkpoint.tinker_path))


def rl_step(log: TenantLog, training: tinker.TrainingClient, tokenizer, shape: RlShape) -> None:
    """Sample a group per prompt with the current weights, score, and train on the group-relative advantages."""
    sampler = log.result("save_sampler", training.save_weights_and_get_sampling_client())
    params = types.SamplingParams(max_tokens=shape.max_tokens, temperature=1.0)
    prompts = [
        tokenizer.encode(f"Write the SQL query for question {log.step * shape.prompts + i}: how many rows are there?")
        for i in range(shape.prompts)
    ]
    sent = time.time()
    futures = [sampler.sample(types.ModelInput.from_ints(prompt), shape.group, params) for prompt in prompts]
    # Every future is waited for, so that each request sent is counted, before the first failure goes up.
    answers, failures = [], []
    for future in futures:
        try:
            answers.append(log.result("sample", future, sent))
        except Exception as error:
            failures.append(error)
    if failures:
        raise failures[0]
    datums = []
    for prompt, answer in zip(prompts, answers, strict=True):
        completions = [sequence for sequence in answer.sequences if sequence.tokens]
        advantages_G = group_advantages([reward(list(s.tokens)) for s in completions], normalize_std=True)
        if advantages_G is None:
            continue
        for sequence, advantage in zip(completions, advantages_G, strict=True):
            tokens = list(sequence.tokens)
            logprobs = list(sequence.logprobs or [0.0] * len(tokens))
            datums.append(rl_datum(prompt, tokens, logprobs, [advantage] * len(tokens)))
    if datums:
        log.result("forward_backward", training.forward_backward(datums, "importance_sampling"))
    log.result("optim_step", training.optim_step(types.AdamParams(learning_rate=LEARNING_RATE)))


def train_once(log: TenantLog, training: tinker.TrainingClient) -> None:
    """One supervised step, so the run's saved states hold optimizer moments as an RL run's do."""
    tokens = training.get_tokenizer().encode("SELECT name FROM customers WHERE city = 'Berlin';")
    datum = supervised_datum(tokens[:4], tokens[4:])
    log.result("forward_backward", training.forward_backward([datum], "cross_entropy"))
    log.result("optim_step", training.optim_step(types.AdamParams(learning_rate=LEARNING_RATE)))


def checkpoint_tenant(log: TenantLog, url: str, base_model: str, period_s: float, until: Deadline) -> None:
    """Save every `period_s`, a training state and sampler weights by turns; every third save, load one of the saved
    sampler weights and sample from them; when the key's storage quota refuses a save, delete the oldest save and go
    on. After an interruption, from its newest training state."""
    saved: list[str] = []  # tinker paths, oldest first
    rng = random.Random(0)
    count = 0
    for service, rest in sessions(log, url, until):
        try:
            states = [path for path in saved if "/weights/" in path]
            if states:
                training = log.result(
                    "load_state", service.create_training_client_from_state_with_optimizer(states[-1])
                )
            else:
                created = service.create_lora_training_client(base_model=base_model, rank=LORA_RANK, seed=7)
                training = log.result("create", created)
                train_once(log, training)
            prompt = types.ModelInput.from_ints(training.get_tokenizer().encode("SELECT"))
            while until.ahead():
                count += 1
                name = f"save-{count:05d}"
                save = training.save_state(name) if count % 2 else training.save_weights_for_sampler(name)
                try:
                    saved.append(log.result("save_state" if count % 2 else "save_sampler", save).path)
                except tinker.RequestFailedError as error:
                    if "--max-storage-bytes-per-key" not in str(error) or not saved:
                        raise
                    log.quota_refusals += 1
                    log.result("delete", rest.delete_checkpoint_from_tinker_path(saved.pop(0)))
                samplers = [path for path in saved if "/sampler_weights/" in path]
                if count % 3 == 0 and samplers:
                    sampler = log.result(
                        "load_sampler", service.create_sampling_client(model_path=rng.choice(samplers))
                    )
                    log.result("sample", sampler.sample(prompt, 1, types.SamplingParams(max_tokens=4)))
                time.sleep(period_s)
        except Exception:  # recorded by `result`: the backend went away; go on from the newest state
            time.sleep(RETRY_PAUSE_S)


def saved_adapter(log: TenantLog, url: str, base_model: str) -> str:
    """The tinker path of sampler weights of a fresh adapter the tenant saves, for its /v1 requests to name."""
    with tinker.ServiceClient(base_url=url, api_key=log.key) as service:
        created = service.create_lora_training_client(base_model=base_model, rank=LORA_RANK, seed=11)
        training = log.result("create", created)
        return log.result("save_sampler", training.save_weights_for_sampler("evaluated")).path


@dataclass(frozen=True)
class EvalShape:
    in_flight: int  # requests the tenant keeps in flight
    max_tokens: int


def evaluating_tenant(log: TenantLog, url: str, model: str, shape: EvalShape, until: Deadline) -> None:
    """`shape.in_flight` clients, each sending a /v1/completions request as soon as its last one was answered, until
    `until`."""
    limits = httpx.Limits(max_connections=shape.in_flight, max_keepalive_connections=shape.in_flight)
    headers = {"Authorization": f"Bearer {log.key}"}
    with (
        httpx.Client(base_url=url, headers=headers, limits=limits, timeout=REQUEST_TIMEOUT_S) as client,
        ThreadPoolExecutor(shape.in_flight, thread_name_prefix=log.name) as pool,
    ):

        def loop(slot: int) -> None:
            number = 0
            while until.ahead():
                number += 1
                completion(log, client, model, shape.max_tokens, seed=slot * 1_000_000 + number)

        for finished in [pool.submit(loop, slot) for slot in range(shape.in_flight)]:
            finished.result()


def completion(log: TenantLog, client: httpx.Client, model: str, max_tokens: int, seed: int) -> None:
    """One /v1/completions request, retried on connection errors (a request the killed server held included, as
    the server disconnected without an answer) for up to RETRY_FOR_S."""
    body = {
        "model": model,
        "prompt": f"-- SQL for question {seed}: how many customers live in each city?\nSELECT",
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": seed,
    }
    sent = time.time()
    while True:
        try:
            reply = client.post("/v1/completions", json=body)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
            if time.time() - sent > RETRY_FOR_S:
                log.add(
                    Request(
                        "completion", sent, time.time(), Outcome.LOST, error="connection errors past the retry time"
                    )
                )
                return
            log.retried()
            time.sleep(RETRY_PAUSE_S)
            continue
        except httpx.HTTPError as error:  # a timeout while reading the answer: no answer
            log.add(Request("completion", sent, time.time(), Outcome.LOST, error=f"{type(error).__name__}: {error}"))
            return
        break
    ended = time.time()
    if reply.status_code >= 500:
        log.add(Request("completion", sent, ended, Outcome.SERVER_ERROR, error=reply.text[:300]))
    elif reply.status_code >= 400:
        log.add(Request("completion", sent, ended, Outcome.REFUSED, error=reply.text[:300]))
    else:
        tokens = int(reply.json()["usage"]["completion_tokens"])
        log.add(Request("completion", sent, ended, Outcome.ANSWERED, tokens=tokens))
