"""The trial: a GRPO-style RL loop over the Tinker API, from a config to a held-out score.

A fresh LoRA adapter (or the weights of `init_from`) first learns the answer format from `warmup_steps` of
cross-entropy on the task's gold completions; held-out accuracy is measured where RL starts, every
`eval_interval` steps and at the end, and the first and last evaluations are compared question by question. Each RL
step: sample, with the sampler of the weights the last step left, a group of completions for each prompt of the
batch, score them with the task under the reward spec, turn rewards into group-relative advantages (minus a
per-token KL penalty against the base model when asked), and send one forward_backward, one optim_step and the next
sampler's weights back to back. Only the official `tinker` SDK is used, so the same loop runs against the local
backend, a cluster or any Tinker service.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import tinker
from tinker import types

from autoresearch.errors import ConfigurationError
from autoresearch.trials.backend import TRIAL_METADATA_KEY, api_key, backend_for
from autoresearch.trials.config import InitialState, TrialConfig
from autoresearch.trials.data import PromptRenderer, TrainingOrder, held_out_subset, training_examples
from autoresearch.trials.datums import supervised_datum
from autoresearch.trials.evaluation import evaluate_sampler, session_metadata
from autoresearch.trials.metrics import StepMetrics, summarize_groups
from autoresearch.trials.paired import compare, compare_by_form
from autoresearch.trials.plot import plot_run
from autoresearch.trials.progress import TrialProgress
from autoresearch.trials.rollouts import derived_seed, sample_groups, score_groups
from autoresearch.trials.run_dir import RunDirectory, RunState, TrialResult
from autoresearch.trials.start_evaluations import StartEvaluations, starts_from_the_base_model
from autoresearch.trials.training_batch import build_training_batch, select_samples
from tasks.interface import AnyTask
from tasks.registry import open_task
from tasks.report import HeldOutReport

DEFAULT_RUN_DIR = Path(".data/trials")
# A backend that restarts (a crash, a redeploy, a preempted node) fails the requests it had in flight; the trial goes
# on from its last checkpoint this many times before it gives up.
MAX_BACKEND_INTERRUPTIONS = 3

logger = logging.getLogger(__name__)

# Called with each held-out evaluation; returning False stops the trial there (e.g. Optuna's pruner said so).
EvalCallback = Callable[[HeldOutReport], bool]


def new_run_id() -> str:
    return f"trial-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def run_trial(
    config: TrialConfig,
    backend_url: str | None = None,
    run_dir: Path = DEFAULT_RUN_DIR,
    progress: bool = True,
    on_eval: EvalCallback | None = None,
) -> TrialResult:
    """Run (or resume) one trial and return its held-out score.

    The run lives in `run_dir/<run_id>/`; a trial started again with the same run id continues from its last
    checkpoint. One that already finished returns its stored result at once, unless the config now asks for more
    steps (and it was not stopped early): then it trains on from its final checkpoint. Without `backend_url` (or
    $TINKER_BASE_URL) a local backend is started for the trial and stopped after it.

    Raises:
        ConfigurationError: the config does not fit the data set (a missing split, too large an eval_size).
        ResumeError: the run directory holds another config or an unreadable state.
        BackendStartError: the local backend did not come up.
    """
    started = time.monotonic()
    config = config.model_copy(update={"run_id": config.run_id or new_run_id()})
    directory = RunDirectory(run_dir / str(config.run_id))
    directory.check_config(config)
    state = directory.load_state()
    stored = directory.read_result() if state is not None and state.finished else None
    if state is not None and stored is not None:
        if stored.stopped_early or config.steps <= state.step:
            return stored
        # Asked for more steps than the run finished with: it goes on from its final checkpoint.
        state = state.model_copy(update={"finished": False, "sampler_path": None})
    resumed_from_step = state.step if state is not None and state.checkpoint_path is not None else None
    for interruption in range(MAX_BACKEND_INTERRUPTIONS + 1):
        try:
            with (
                backend_for(config.base_model, backend_url, directory.backend_root) as url,
                tinker.ServiceClient(
                    base_url=url, api_key=api_key(), user_metadata=session_metadata(config)
                ) as service,
                open_task(config.task, config.data) as task,
                TrialProgress(str(config.run_id), progress) as view,
            ):
                # Its connections are the SDK's, shared and open for the process's life: nothing to close.
                rest = tinker.RestClient(base_url=url, api_key=api_key())
                training, state = _start_or_resume(service, rest, config, state)
                # Steps after the checkpoint are redone, so their records go.
                directory.metrics.keep_until(state.step)
                directory.evals.keep_until(state.step)
                directory.warmup.keep_until(state.warmup_steps_done)
                trial = _Trial(config, directory, task, service, rest, training, view, on_eval)
                return trial.run(state, resumed_from_step, interruption, started)
        except (tinker.RequestFailedError, tinker.APIStatusError, tinker.APIConnectionError) as error:
            if not _backend_interrupted(error) or interruption == MAX_BACKEND_INTERRUPTIONS:
                raise
            state = directory.load_state()
            at = f"step {state.step}" if state is not None and state.checkpoint_path is not None else "the start"
            logger.warning("run %s: the backend was interrupted (%s); resuming from %s", config.run_id, error, at)
    raise AssertionError("unreachable: the last interruption re-raises")


def _backend_interrupted(error: tinker.TinkerError) -> bool:
    """Whether `error` is the backend going away rather than the trial's own fault: it could not be reached, it
    failed a request on its side (a restart fails every request it had in flight), or it no longer holds the
    model's live weights (they died with the process; the run's checkpoint has them)."""
    if isinstance(error, tinker.RequestFailedError):
        return error.category is types.RequestErrorCategory.Server
    if isinstance(error, tinker.APIStatusError):
        return error.status_code >= 500 or error.status_code == 404
    return True


def _start_or_resume(
    service: tinker.ServiceClient, rest: tinker.RestClient, config: TrialConfig, state: RunState | None
) -> tuple[tinker.TrainingClient, RunState]:
    """A training client at the run's last checkpoint (adapter and optimizer state), else at `init_from`'s weights,
    else with a fresh adapter.

    Returns the client and the state it stands at.
    """
    metadata = _run_metadata(config)
    if state is not None and state.checkpoint_path is not None:
        training = service.create_training_client_from_state_with_optimizer(
            state.checkpoint_path, user_metadata=metadata
        ).result()
        earlier = types.ParsedCheckpointTinkerPath.from_tinker_path(state.checkpoint_path).training_run_id
        if earlier != training.model_id and earlier not in state.left_behind:
            state = state.model_copy(update={"left_behind": (*state.left_behind, earlier)})
        # All the runs left behind hold but the state resumed from goes now, and that one once the new run has saved
        # (`_checkpointed`): were it all kept until then, a key's storage quota could refuse that first save.
        for run in state.left_behind:
            _deleted_checkpoints_of(rest, run, keeping=state.checkpoint_path)
        return training, state
    if config.init_from is not None:
        training = _from_initial_state(service, config, config.init_from)
    else:
        training = service.create_lora_training_client(
            base_model=config.base_model,
            rank=config.lora_rank,
            seed=config.seed,
            train_mlp=config.train_mlp,
            train_attn=config.train_attn,
            train_unembed=config.train_unembed,
            user_metadata=metadata,
        ).result()
    fresh = RunState(
        run_id=str(config.run_id),
        step=0,
        warmup_steps_done=0,
        data_position=config.init_from.examples_seen if config.init_from is not None else 0,
        checkpoint_path=None,
        seed=config.seed,
        eval_seed=config.eval_seed,
    )
    return training, fresh


def _run_metadata(config: TrialConfig) -> dict[str, str]:
    """What the backend is told about the trial's run: which trial it belongs to and how many checkpoints of each
    kind to keep."""
    metadata = {TRIAL_METADATA_KEY: str(config.run_id)}
    if config.keep_checkpoints is not None:
        metadata["keep_checkpoints"] = str(config.keep_checkpoints)
    return metadata


def _from_initial_state(
    service: tinker.ServiceClient, config: TrialConfig, initial: InitialState
) -> tinker.TrainingClient:
    """A training client with the weights of `initial` and a fresh optimizer; its rank must be the config's, or
    the trial would silently train another adapter than the one it names.

    Raises:
        ConfigurationError: the state cannot be loaded, or its LoRA rank is not the config's.
    """
    try:
        training = service.create_training_client_from_state(initial.path, user_metadata=_run_metadata(config)).result()
    except tinker.TinkerError as error:
        raise ConfigurationError(f"init_from: cannot load {initial.path}: {error}") from None
    rank = training.get_info().lora_rank
    if rank is not None and rank != config.lora_rank:
        raise ConfigurationError(
            f"init_from: {initial.path} holds a rank-{rank} adapter; the trial config asks for rank {config.lora_rank}"
        )
    return training


class _Trial:
    """One run's clients and data; `run` is the whole algorithm, top to bottom."""

    def __init__(
        self,
        config: TrialConfig,
        directory: RunDirectory,
        task: AnyTask,
        service: tinker.ServiceClient,
        rest: tinker.RestClient,
        training: tinker.TrainingClient,
        view: TrialProgress,
        on_eval: EvalCallback | None,
    ) -> None:
        self.config = config
        self.directory = directory
        self.service = service
        self.rest = rest
        self.training = training
        self.task = task
        self.view = view
        self.on_eval = on_eval
        self.renderer = PromptRenderer.of_trial(task, training.get_tokenizer(), config)
        view.note(f"prompts in the {self.renderer.format} format ({_FORMAT_MEANING[self.renderer.format]})")
        self.order = TrainingOrder(training_examples(task, config, self.renderer.shot_ids), config.seed)
        self.held_out = held_out_subset(task, config.eval_split, config.eval_size, config.eval_seed)
        self.base_sampler = (
            service.create_sampling_client(base_model=config.base_model).result() if config.kl_coef > 0 else None
        )

    def run(
        self, state: RunState, resumed_from_step: int | None, backend_interruptions: int, started: float
    ) -> TrialResult:
        config, directory, training = self.config, self.directory, self.training
        if state.warmup_steps_done < config.warmup_steps:
            state = self._warmup(state)

        sampler = training.save_weights_and_get_sampling_client().result()
        last_report = _last_report(directory, state.step)
        if state.step == 0 and config.eval_interval and last_report is None:
            # Where RL starts from (after any warm-up), so the curve separates what each phase did. Not passed to
            # on_eval: no RL has run yet to judge.
            last_report = self._evaluate_start(sampler)
        stopped_early = False
        if last_report is None and state.step > 0 and self._evaluates_at(state.step):
            # Stopped during this step's evaluation, after its checkpoint: evaluated now, the step not redone.
            last_report = self._evaluate(sampler, state.step)
            stopped_early = self.on_eval is not None and not self.on_eval(last_report)
        self.view.phase("RL", config.steps, state.step)
        last_step = state.step if stopped_early else config.steps
        for step in range(state.step + 1, last_step + 1):
            metrics, sampler = self._rl_step(sampler, step, state.data_position)
            directory.metrics.append(metrics.to_record())
            self.view.rl_step(metrics)
            due = step % config.checkpoint_interval == 0 or step == config.steps
            checkpoint = training.save_state(_checkpoint_name(step)) if due else None
            state = state.model_copy(update={"step": step, "data_position": state.data_position + config.batch_size})
            if self._evaluates_at(step):
                if checkpoint is not None:
                    # Recorded before the evaluation, which may take many steps' time: a run stopped during it
                    # resumes at the evaluation, not a step before it.
                    state = self._checkpointed(state.model_copy(update={"checkpoint_path": checkpoint.result().path}))
                    checkpoint = None
                last_report = self._evaluate(sampler, step)
                stopped_early = self.on_eval is not None and not self.on_eval(last_report)
            if stopped_early and not due:
                checkpoint = training.save_state(_checkpoint_name(step))
            if checkpoint is not None:
                state = self._checkpointed(state.model_copy(update={"checkpoint_path": checkpoint.result().path}))
            if stopped_early:
                break
        if last_report is None or last_report.step != state.step:
            last_report = self._evaluate(sampler, state.step)
        return self._finish(state, last_report, stopped_early, resumed_from_step, backend_interruptions, started)

    def _evaluates_at(self, step: int) -> bool:
        """Whether the held-out split is evaluated after RL step `step`."""
        config = self.config
        return step == config.steps or bool(config.eval_interval and step % config.eval_interval == 0)

    def _adam(self, learning_rate: float) -> types.AdamParams:
        c = self.config
        return types.AdamParams(
            learning_rate=learning_rate,
            beta1=c.beta1,
            beta2=c.beta2,
            eps=c.eps,
            weight_decay=c.weight_decay,
            grad_clip_norm=c.grad_clip_norm,
        )

    def _warmup(self, state: RunState) -> RunState:
        """Cross-entropy on gold completions (prompt positions weighted 0), then a checkpoint; redone whole if
        interrupted."""
        config, training = self.config, self.training
        position = state.data_position
        batch_size = config.warmup_batch_size or config.batch_size
        self.view.phase("warm-up", config.warmup_steps, 0)
        for step in range(1, config.warmup_steps + 1):
            step_started = time.monotonic()
            examples = self.order.batch(position, batch_size)
            position += batch_size
            pairs = [(self.renderer.prompt(e).tokens, self.renderer.gold_completion(e)) for e in examples]
            update = training.forward_backward([supervised_datum(p, c) for p, c in pairs], "cross_entropy")
            optimizer = training.optim_step(self._adam(config.warmup_learning_rate))
            loss = update.result().metrics["loss:sum"] / sum(len(c) for _, c in pairs)
            optimizer.result()
            self.directory.warmup.append(
                {"step": step, "nll_per_token": loss, "step_time_s": time.monotonic() - step_started}
            )
            self.view.warmup_step(step, loss)
        checkpoint = training.save_state(f"warmup-{config.warmup_steps:06d}").result().path
        return self._checkpointed(
            state.model_copy(
                update={
                    "warmup_steps_done": config.warmup_steps,
                    "data_position": position,
                    "checkpoint_path": checkpoint,
                }
            )
        )

    def _checkpointed(self, state: RunState) -> RunState:
        """Record `state`, whose checkpoint this run has just saved; then the runs it left behind are of no more use,
        and their checkpoints go (on a backend with a storage quota they would fill it, a run per interruption). A
        deletion that fails is tried again at the next checkpoint."""
        self.directory.save_state(state)
        if not state.left_behind:
            return state
        remaining = tuple(run for run in state.left_behind if not _deleted_checkpoints_of(self.rest, run))
        state = state.model_copy(update={"left_behind": remaining})
        self.directory.save_state(state)
        return state

    def _rl_step(
        self, sampler: tinker.SamplingClient, step: int, position: int
    ) -> tuple[StepMetrics, tinker.SamplingClient]:
        """One RL step; returns its metrics and a sampler of the updated weights."""
        config, training = self.config, self.training
        step_started = time.monotonic()
        prompts = [self.renderer.prompt(e) for e in self.order.batch(position, config.batch_size)]
        params = [
            types.SamplingParams(
                max_tokens=config.max_tokens,
                temperature=config.temperature,
                stop=list(config.stop),
                seed=derived_seed(config.seed, step, i),
            )
            for i in range(len(prompts))
        ]
        sampling_started = time.monotonic()
        # DRO's penalty also acts on prompt positions, so they need the sampler's own log-probs (datums.rl_datum).
        groups = sample_groups(
            sampler, prompts, config.group_size, params, self.renderer, include_prompt_logprobs=config.loss == "dro"
        )
        sampling_s = time.monotonic() - sampling_started
        groups = score_groups(groups, self.task, config.reward_spec)
        samples = select_samples(groups, config.normalize_advantages)
        base_logprobs = self._base_logprobs([(s.group.prompt.tokens, s.completion.tokens) for s in samples])
        batch = build_training_batch(samples, base_logprobs, config.kl_coef)

        loss = None
        if batch.datums:
            # Submitted back to back: the server runs them in seq_id order while the client waits only once.
            update = training.forward_backward(batch.datums, config.loss, config.loss_fn_config or None)
            optimizer = training.optim_step(self._adam(config.learning_rate))
            next_sampler = training.save_weights_and_get_sampling_client()
            loss = update.result().metrics["loss:sum"] / batch.completion_tokens
            optimizer.result()
            sampler = next_sampler.result()

        summary = summarize_groups(groups)
        metrics = StepMetrics(
            step=step,
            reward_mean=summary.reward_mean,
            reward_std=summary.reward_std,
            reward_components=summary.reward_components,
            accuracy=summary.accuracy,
            groups_kept=batch.groups_kept,
            datums=len(batch.datums),
            loss=loss,
            kl=batch.kl,
            completion_tokens_mean=summary.completion_tokens / summary.completions,
            tokens_per_s=summary.completion_tokens / sampling_s if sampling_s > 0 else 0.0,
            step_time_s=time.monotonic() - step_started,
            turns_mean=summary.turns_mean if self.renderer.max_turns > 1 else None,
        )
        return metrics, sampler

    def _base_logprobs(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]] | None:
        """The base model's log-prob of each completion token, all sequences in flight at once; None without KL."""
        if self.base_sampler is None:
            return None
        futures = [
            self.base_sampler.compute_logprobs(types.ModelInput.from_ints([*prompt, *completion]))
            for prompt, completion in sequences
        ]
        return [
            [float(lp) for lp in future.result()[len(prompt) :]]
            for future, (prompt, _) in zip(futures, sequences, strict=True)
        ]

    def _evaluate(self, sampler: tinker.SamplingClient, step: int) -> HeldOutReport:
        config = self.config
        report = evaluate_sampler(
            sampler, self.renderer, self.held_out, config.eval_split, config.max_tokens, config.stop, step
        )
        return self._record(report)

    def _evaluate_start(self, sampler: tinker.SamplingClient) -> HeldOutReport:
        """Where RL starts; from the base model, the base model's evaluation the run's folder shares, if it does."""
        config = self.config
        if not (config.share_start_evaluation and starts_from_the_base_model(config)):
            return self._evaluate(sampler, 0)

        def evaluate_base_model() -> HeldOutReport:
            base = self.service.create_sampling_client(base_model=config.base_model).result()
            return evaluate_sampler(
                base, self.renderer, self.held_out, config.eval_split, config.max_tokens, config.stop, 0
            )

        return self._record(StartEvaluations(self.directory.root.parent).get_or_evaluate(config, evaluate_base_model))

    def _record(self, report: HeldOutReport) -> HeldOutReport:
        self.directory.evals.append(report.model_dump(mode="json"))
        self.view.held_out(report)
        return report

    def _finish(
        self,
        state: RunState,
        report: HeldOutReport,
        stopped_early: bool,
        resumed_from_step: int | None,
        backend_interruptions: int,
        started: float,
    ) -> TrialResult:
        directory, training = self.directory, self.training
        checkpoint_path = state.checkpoint_path
        if checkpoint_path is None:  # a run of no steps at all
            checkpoint_path = training.save_state(_checkpoint_name(state.step)).result().path
            state = state.model_copy(update={"checkpoint_path": checkpoint_path})
        sampler_path = training.save_weights_for_sampler(f"final-{state.step:06d}").result().path
        metrics = directory.metrics.read()
        evals = directory.evals.read()
        rl_start = next((HeldOutReport.model_validate(e) for e in evals if e["step"] == 0), None)
        rl_comparison, rl_comparison_by_form = None, {}
        if rl_start is not None and report.step > 0:
            rl_comparison, rl_comparison_by_form = compare(rl_start, report), compare_by_form(rl_start, report)
        title = f"{state.run_id}: {self.config.loss}, {self.config.base_model}"
        plot_run(metrics, evals, directory.plot_path, title, directory.warmup.read())
        result = TrialResult(
            run_id=state.run_id,
            run_dir=directory.root,
            steps_completed=state.step,
            held_out_accuracy=report.accuracy,
            held_out_by_difficulty=report.accuracy_by_difficulty,
            held_out_by_form=report.accuracy_by_form,
            held_out_history={e["step"]: e["accuracy"] for e in evals},
            rl_comparison=rl_comparison,
            rl_comparison_by_form=rl_comparison_by_form,
            prompt_format=self.renderer.format,
            final_reward_mean=metrics[-1]["reward_mean"] if metrics else None,
            stopped_early=stopped_early,
            resumed_from_step=resumed_from_step,
            backend_interruptions=backend_interruptions,
            checkpoint_path=checkpoint_path,
            sampler_path=sampler_path,
            wall_time_s=time.monotonic() - started,
        )
        directory.write_result(result)
        directory.save_state(state.model_copy(update={"finished": True, "sampler_path": sampler_path}))
        return result


def _deleted_checkpoints_of(rest: tinker.RestClient, run: str, keeping: str | None = None) -> bool:
    """Delete every checkpoint of the backend's run `run` but the one at the tinker path `keeping`; whether all of
    them went (a run the backend no longer knows has none)."""
    try:
        for checkpoint in rest.list_checkpoints(run).result().checkpoints:
            if checkpoint.tinker_path != keeping:
                rest.delete_checkpoint_from_tinker_path(checkpoint.tinker_path).result()
    except tinker.NotFoundError:
        return True
    except tinker.TinkerError as error:
        logger.warning("could not delete the checkpoints of the run %s left behind: %s", run, error)
        return False
    return True


_FORMAT_MEANING = {
    "chat": "the task's prompt as the user turn of the model's chat template",
    "plain": "the task's prompt as text the model continues",
}


def _checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def _last_report(directory: RunDirectory, step: int) -> HeldOutReport | None:
    """The evaluation already logged for `step`, so a resumed run does not evaluate that step twice."""
    records = directory.evals.read()
    if records and records[-1]["step"] == step:
        return HeldOutReport.model_validate(records[-1])
    return None
