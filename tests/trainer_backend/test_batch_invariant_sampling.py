"""Batch-invariant sampling: a request asked for so runs as a device call of its own rows only, which takes nothing in
and is taken into nothing, so its answer is what it gets alone, bit for bit, whatever else the server runs.

The scheduler's part with scripted batch runners; the rest on the real server of the tiny model through the real SDK
(a session's user_metadata), the OpenAI-compatible endpoint and a trial's held-out evaluation. Which device call each
request ran in is read from the scheduler's per-operation log line (`batch`, `joined`, `alone`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import openai
import pytest
import tinker
from support.backends import REPOSITORY, TINY
from support.scheduling import finished, running, sample_operation, wait_for
from support.trained_adapters import trained_adapter
from support.trainer import SQL, RawApi
from tinker import types

from autoresearch.trials.config import load_trial_config
from autoresearch.trials.evaluation import evaluate_checkpoint
from tasks.text2sql.task import Text2SqlTask
from trainer_backend.engine.types import SamplingRequest
from trainer_backend.ledger import Ledger, ResultFormat
from trainer_backend.operations import BatchCall, BatchKind, Operation
from trainer_backend.samplers.interface import RecordedSamplingRequest
from trainer_backend.samplers.routing import BATCH_INVARIANT, RoutedSampler
from trainer_backend.scheduler import Scheduler
from trainer_backend.server import RunningServer
from trainer_backend.wire.status import SamplerStatus

EVALUATOR_KEY = "tml-batch-invariant-evaluator"
NEIGHBOUR_KEY = "tml-batch-invariant-neighbour"
PROMPTS = [[5, 9, 14], [7, 3, 22, 41, 8, 2], [11], [30, 12, 9, 4, 4, 17, 2, 40, 21], [2, 60, 33, 7], [19, 19, 5, 8, 50]]
GREEDY = types.SamplingParams(max_tokens=16, temperature=0.0)


# --- the scheduler ------------------------------------------------------------------------------------------------


def holding(ledger: Ledger, gate: threading.Event) -> Operation:
    """An operation that keeps the device busy until `gate` is set (at most 5 s)."""
    record, _ = ledger.submit("alice", "hold", f"hold-{time.monotonic_ns()}")

    def work() -> tuple[bytes, ResultFormat]:
        gate.wait(5)
        return b"{}", ResultFormat.JSON

    return Operation(record.request_id, "hold", "holder", work)


def stepping_generation(steps: int, calls: list[list[str]], admitted: list[tuple[str, list[str]]]):
    """A batch runner that notes each call's operations, then runs `steps` steps of 10 ms, taking in whatever the
    scheduler lets it before each (noted beside the call's first operation) and pausing after each."""

    def generation(operations: list[Operation], call: BatchCall) -> list[tuple[bytes, ResultFormat]]:
        calls.append([op.payload for op in operations])
        running = list(operations)
        for _ in range(steps):
            taken = call.admit(lambda op: True)
            admitted.append((operations[0].payload, [op.payload for op in taken]))
            running += taken
            call()
            time.sleep(0.01)
        return [(op.payload.encode(), ResultFormat.JSON) for op in running]

    return generation


@dataclass(frozen=True)
class Generations:
    """A started scheduler whose "sample" kind runs each call as 40 steps of `stepping_generation`, gathering for
    50 ms: the operations each call was given, and what it took in before each step."""

    scheduler: Scheduler
    kind: BatchKind
    calls: list[list[str]]
    admitted: list[tuple[str, list[str]]]


@pytest.fixture
def long_generations(start_scheduler: Callable[..., Scheduler]) -> Generations:
    calls: list[list[str]] = []
    admitted: list[tuple[str, list[str]]] = []
    scheduler = start_scheduler()
    kind = BatchKind("sample", stepping_generation(40, calls, admitted), window_s=0.05, nests=True)
    scheduler.register(kind)
    return Generations(scheduler, kind, calls, admitted)


def test_operations_that_run_alone_never_share_a_device_call(
    ledger: Ledger, start_scheduler: Callable[..., Scheduler]
) -> None:
    calls: list[list[str]] = []
    scheduler = start_scheduler()
    kind = BatchKind("sample", stepping_generation(2, calls, []), nests=True)
    scheduler.register(kind)
    gate = threading.Event()
    scheduler.submit(holding(ledger, gate))
    wait_for(lambda: bool(scheduler.stats().running))
    queued = [sample_operation(ledger, kind, "eval", f"eval-{i}", alone=True) for i in range(3)]
    queued += [sample_operation(ledger, kind, lane, lane) for lane in ("rl-1", "rl-2")]
    for operation in queued:
        scheduler.submit(operation)
    gate.set()
    wait_for(lambda: all(ledger.get(op.request_id).finished for op in queued))

    # Queued together, the other tenants' requests share one call; each of those that run alone has its own.
    assert sorted(sorted(call) for call in calls) == [["eval-0"], ["eval-1"], ["eval-2"], ["rl-1", "rl-2"]]


def test_a_running_generation_takes_in_no_operation_that_runs_alone_which_runs_in_its_pause_on_its_own(
    ledger: Ledger, long_generations: Generations
) -> None:
    scheduler, kind = long_generations.scheduler, long_generations.kind
    heavy = running(scheduler, sample_operation(ledger, kind, "heavy", "heavy"))
    evaluation, light = (
        sample_operation(ledger, kind, "eval", "eval", alone=True),
        sample_operation(ledger, kind, "light", "light"),
    )
    for operation in (evaluation, light):
        scheduler.submit(operation)
    wait_for(lambda: ledger.get(evaluation.request_id).finished)

    assert not ledger.get(heavy.request_id).finished, "it ran in the heavy generation's pause, not after it"
    assert ["eval"] in long_generations.calls
    wait_for(lambda: ledger.get(light.request_id).finished)
    taken = [payload for _, payloads in long_generations.admitted for payload in payloads]
    assert "light" in taken and "eval" not in taken


def test_a_generation_that_runs_alone_takes_nothing_in_and_others_run_in_its_pause(
    ledger: Ledger, long_generations: Generations
) -> None:
    scheduler, kind = long_generations.scheduler, long_generations.kind
    evaluation = running(scheduler, sample_operation(ledger, kind, "eval", "eval", alone=True))
    finished(scheduler, ledger, sample_operation(ledger, kind, "light", "light"))

    assert not ledger.get(evaluation.request_id).finished, "it ran in the lone generation's pause, not after it"
    wait_for(lambda: ledger.get(evaluation.request_id).finished)
    assert long_generations.calls == [["eval"], ["light"]]
    assert all(not taken for first, taken in long_generations.admitted if first == "eval")


# --- routing beside vLLM -------------------------------------------------------------------------------------------


class RecordingSampler:
    """Stands in for vLLM and the built-in engine, noting the jobs each is handed: only the routing rule is under test
    here (vLLM itself is exercised in test_vllm_sampler.py, where it is installed)."""

    name = "vllm"

    def __init__(self) -> None:
        self.jobs: list[RecordedSamplingRequest] = []

    def serves(self, request: SamplingRequest) -> str | None:
        return None

    def submit(self, job: RecordedSamplingRequest) -> None:
        self.jobs.append(job)

    def status(self) -> SamplerStatus:
        return SamplerStatus(in_flight=0, requests=len(self.jobs), busy_seconds=0.0, restarts=0)


def test_beside_vllm_a_batch_invariant_request_goes_to_the_built_in_engine_and_is_counted() -> None:
    vllm, builtin = RecordingSampler(), RecordingSampler()
    router = RoutedSampler(vllm, builtin)
    request = SamplingRequest(prompt_tokens=(5, 9), temperature=0.0)
    invariant, batched = (
        RecordedSamplingRequest(f"req-{i}", "alice", "lane", None, request, batch_invariant=i == 0) for i in range(2)
    )
    router.submit(invariant)
    router.submit(batched)

    assert builtin.jobs == [invariant] and vllm.jobs == [batched]
    assert router.status().builtin_requests == {BATCH_INVARIANT: 1}


# --- the server, through the SDK, the OpenAI-compatible endpoint and a trial's evaluation -----------------------------


@pytest.fixture(scope="module")
def evaluator(server: RunningServer) -> Iterator[tinker.ServiceClient]:
    """A client whose session asks for its greedy requests to be answered as if alone on the server."""
    with tinker.ServiceClient(
        base_url=server.url, api_key=EVALUATOR_KEY, user_metadata={"batch_invariant": "greedy"}
    ) as client:
        yield client


@pytest.fixture
def samples_run(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[int], list[logging.LogRecord]]]:
    """`samples_run(n)`: the scheduler's log lines of the first `n` sampling requests finished in the test, once
    there are that many (a line is written a moment after its future resolves)."""

    def records() -> list[logging.LogRecord]:
        scheduler = [r for r in caplog.records if r.name == "trainer_backend.scheduler"]
        return [r for r in scheduler if getattr(r, "kind", "") == "sample"]

    def first(count: int) -> list[logging.LogRecord]:
        wait_for(lambda: len(records()) >= count)
        return records()[:count]

    with caplog.at_level(logging.INFO, logger="trainer_backend.scheduler"):
        yield first


@pytest.mark.slow
def test_a_checkpoints_greedy_answers_are_the_same_bit_for_bit_alone_and_beside_another_tenants_generations(
    server: RunningServer, evaluator: tinker.ServiceClient, samples_run: Callable[[int], list[logging.LogRecord]]
) -> None:
    # Ephemeral sampler weights, in the evaluator's session, as a trial's evaluations sample them.
    sampler = trained_adapter(evaluator, SQL, seed=5, steps=2).save_weights_and_get_sampling_client().result()
    prompts = [types.ModelInput.from_ints(p) for p in PROMPTS]

    def evaluate() -> list[types.SampleResponse]:
        futures = [sampler.sample(prompt=p, num_samples=1, sampling_params=GREEDY) for p in prompts]
        return [future.result() for future in futures]

    alone = evaluate()
    with tinker.ServiceClient(base_url=server.url, api_key=NEIGHBOUR_KEY) as neighbour:
        # A long generation, and requests of another sampler of the neighbour's that share generation batches with it
        # or in its pauses.
        long_runner, joiner = (neighbour.create_sampling_client(base_model=TINY).result() for _ in range(2))
        long_params = types.SamplingParams(max_tokens=160, stop=[], temperature=0.8, seed=1)
        long_one = long_runner.sample(prompt=prompts[0], num_samples=2, sampling_params=long_params)
        wait_for(lambda: bool(server.service.scheduler.stats().running))
        joining_params = types.SamplingParams(max_tokens=40, temperature=0.8, seed=3)
        joining = [joiner.sample(prompt=p, num_samples=2, sampling_params=joining_params) for p in prompts]
        beside = evaluate()
        for future in (long_one, *joining):
            future.result()
    records = samples_run(2 * len(PROMPTS) + 1 + len(PROMPTS))

    assert [r.sequences[0].tokens for r in beside] == [r.sequences[0].tokens for r in alone]
    assert [r.sequences[0].logprobs for r in beside] == [r.sequences[0].logprobs for r in alone]
    evaluations = [r for r in records if r.alone]
    assert len(evaluations) == 2 * len(PROMPTS)
    assert all(r.batch == 1 and not r.joined for r in evaluations), "an evaluation request joined or was joined"
    # The neighbour's requests did share generation batches meanwhile, as the evaluator's would have without asking.
    assert any(r.joined or r.batch > 1 for r in records if not r.alone)


def test_a_greedy_session_still_batches_its_sampled_requests(
    evaluator: tinker.ServiceClient, samples_run: Callable[[int], list[logging.LogRecord]]
) -> None:
    sampler = evaluator.create_sampling_client(base_model=TINY).result()
    prompt = types.ModelInput.from_ints(PROMPTS[1])
    sampler.sample(prompt=prompt, num_samples=1, sampling_params=GREEDY).result()
    sampled = types.SamplingParams(max_tokens=8, temperature=0.7, seed=2)
    sampler.sample(prompt=prompt, num_samples=1, sampling_params=sampled).result()

    assert [r.alone for r in samples_run(2)] == [True, False]


def test_a_session_that_asks_for_an_unknown_batch_invariance_is_refused_with_the_modes(server: RunningServer) -> None:
    body = {"tags": [], "user_metadata": {"batch_invariant": "yes"}, "sdk_version": "0.38.0"}
    reply = RawApi(server.url, EVALUATOR_KEY).post("/create_session", body)

    assert reply.status_code == 400
    assert "'batch_invariant' must be one of off, greedy, all" in reply.text and "'yes'" in reply.text


def test_an_openai_completion_asks_for_batch_invariance_in_its_body(
    server: RunningServer, samples_run: Callable[[int], list[logging.LogRecord]]
) -> None:
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key=NEIGHBOUR_KEY, max_retries=0, timeout=60)
    asked = {"model": TINY, "prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0}
    batched = oai.completions.create(**asked)
    invariant = oai.completions.create(**asked, extra_body={"batch_invariant": True})

    assert [r.alone for r in samples_run(2)] == [False, True]
    assert invariant.choices[0].text == batched.choices[0].text


def test_a_trials_held_out_evaluation_runs_alone_when_its_config_says_so(
    server: RunningServer, text2sql: Text2SqlTask, samples_run: Callable[[int], list[logging.LogRecord]]
) -> None:
    config = load_trial_config(REPOSITORY / "experiments" / "trials" / "text2sql_tiny.yaml")
    config = config.model_copy(update={"eval_size": 3})
    assert not config.eval_batch_invariant, "off by default"
    invariant = config.model_copy(update={"eval_batch_invariant": True})
    evaluate_checkpoint(invariant, server.url, api_key=EVALUATOR_KEY, task=text2sql)
    evaluate_checkpoint(config, server.url, api_key=EVALUATOR_KEY, task=text2sql)

    assert [r.alone for r in samples_run(6)] == [True] * 3 + [False] * 3
