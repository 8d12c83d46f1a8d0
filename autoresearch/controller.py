"""The controller: a LangGraph state machine, warm-up → propose → launch → baseline → monitor → analyze → (propose
or end). The warm-up node (`shared_warmup.py`) runs only for a spec with `shared_warmup`: the base trial's warm-up,
once per backend, which every trial on that backend then starts its RL from.

The Optuna study and the trials' run directories hold everything that matters; the graph's own state is only
the round counter and how far the analysis got. Every node is safe to run again after a crash: proposals wait in
Optuna's queue until a launch takes them, a launch records the run id on the trial before starting it and the
executor does not start a run twice, and monitoring reconciles each RUNNING trial with what its run directory
says (finished, running, or dead). The graph is compiled with a checkpointer keyed by the study (SQLite beside
the study, or the study's PostgreSQL in a cluster), so a controller killed mid-run, or the next run of a
scheduled job, goes on from the node it stopped in. Trials are spread over the backends given, each trial staying
on the backend that holds its checkpoints.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence

import optuna
import tinker
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from optuna.trial import TrialState
from optuna_dashboard import save_note

from autoresearch.attributes import StudyAttributes, TrialAttributes, record_analysis, record_baseline
from autoresearch.controller_state import ControllerState
from autoresearch.errors import ConfigurationError, ExecutorError, ProposalError, TrialError
from autoresearch.executors import TrialExecutor, TrialPhase
from autoresearch.executors.base import stop_or_warn
from autoresearch.proposer import LlmProposer
from autoresearch.reward_code import RewardCodeAdmission, attach_to_trial, code_component_of
from autoresearch.search import candidate_from_params, distributions, trial_config_of
from autoresearch.shared_warmup import SharedWarmups
from autoresearch.spec import StudySpec
from autoresearch.study import ENDED, RlGain, history, rl_gain_from, run_id_of
from autoresearch.study_sampler import study_sampler
from autoresearch.trials.evaluation import evaluate_checkpoint
from autoresearch.trials.start_evaluations import StartEvaluations
from tasks.errors import TaskError

log = logging.getLogger(__name__)

SAMPLER_RATIONALE = "sampled by Optuna's TPE sampler"
# A trial whose process died is started again (it resumes from its last checkpoint) this many times, then fails.
RELAUNCHES = 1


class Controller:
    """Runs one study's budget of trials on an executor, with an LLM proposer or Optuna's sampler alone.

    With a proposer, the study's sampler becomes the spec's hybrid sampler (`study_sampler`): the LLM on its share of
    the trials, TPE on the rest and on every LLM turn the LLM cannot serve.
    """

    def __init__(
        self,
        spec: StudySpec,
        study: optuna.Study,
        executor: TrialExecutor,
        proposer: LlmProposer | None,
        backend_urls: Sequence[str],
        on_tick: Callable[[optuna.Study], None] = lambda _: None,
        poll_s: float = 2.0,
    ) -> None:
        self.spec = spec
        self.study = study
        self.executor = executor
        self.proposer = proposer
        # Admits the reward functions the LLM writes, where the study lets it write them.
        self.reward_code = (
            RewardCodeAdmission(spec, study)
            if proposer is not None and spec.search_space.reward.code is not None
            else None
        )
        self.sampler = study_sampler(spec, study, proposer, self.reward_code) if proposer is not None else None
        if self.sampler is not None:
            study.sampler = self.sampler
        if not backend_urls:
            raise ValueError("the controller needs at least one backend URL")
        self.backend_urls = tuple(backend_urls)
        self.on_tick = on_tick
        self.poll_s = poll_s
        self.started = time.monotonic()
        self.distributions = distributions(spec)
        self.warmups = SharedWarmups(spec, study, executor, self.backend_urls, on_tick, poll_s)
        # Trials this controller launched. One an earlier controller launched whose process is gone most likely
        # ended with it (stopped, killed, the machine restarted): no fault of the trial's, so not one of its relaunches.
        self._launched: set[int] = set()

    # --- the graph --------------------------------------------------------------------------------------------

    def run(self, checkpointer: BaseCheckpointSaver) -> None:
        """Run the study to its budget (or this run's time limit), resuming a run this checkpointer was left in."""
        graph = self._graph().compile(checkpointer=checkpointer)
        config = {"configurable": {"thread_id": self.spec.study}, "recursion_limit": 100_000}
        pending = graph.get_state(config).next
        try:
            graph.invoke(None if pending else ControllerState(round=0, analysed=0), config)
        finally:
            if self.reward_code is not None:
                self.reward_code.close()

    def _graph(self) -> StateGraph:
        graph = StateGraph(ControllerState)
        graph.add_node("warmup", self.warmups.run)
        graph.add_node("baseline", self.baseline)
        graph.add_node("propose", self.propose)
        graph.add_node("launch", self.launch)
        graph.add_node("monitor", self.monitor)
        graph.add_node("analyze", self.analyze)
        graph.add_edge(START, "warmup")
        graph.add_edge("warmup", "propose")
        graph.add_edge("propose", "launch")
        graph.add_edge("launch", "baseline")
        graph.add_edge("baseline", "monitor")
        graph.add_edge("monitor", "analyze")
        graph.add_conditional_edges("analyze", self.decide, {"propose": "propose", "end": END})
        return graph

    # --- nodes ------------------------------------------------------------------------------------------------

    def baseline(self, state: ControllerState) -> dict:
        """Score the base model once, the number every trial has to beat, while the first trials start (so it does
        not hold them up); a study goes on without it if it fails."""
        if StudyAttributes.of(self.study).baseline_accuracy is not None:
            return {}
        try:
            config = self.spec.trial_config({})
            # The trials that start from the base model read it too, where their answer settings are the same.
            report = StartEvaluations(self.executor.run_root).get_or_evaluate(
                config, lambda: evaluate_checkpoint(config, self.backend_urls[0])
            )
        except (TrialError, TaskError, tinker.TinkerError) as error:
            log.warning("no baseline for this study: %s", error)
            return {}
        try:
            record_baseline(self.study, report.score(self.spec.objective.metric))
        except TaskError as error:
            log.warning("no baseline for this study: %s", error)
        return {}

    def propose(self, state: ControllerState) -> dict:
        """When launch slots are free and none wait, ask the LLM now for its turns among the trials about to start:
        the candidates that pass the checks join Optuna's queue (safe from a crash until launched); a turn it
        cannot fill goes to TPE with the reason, recorded on the study (`rejected_proposals`) and on the trial."""
        if self.sampler is not None and not self._trials(TrialState.WAITING) and self._free_slots() > 0:
            self.sampler.enqueue_llm_proposals(self.study, self._free_slots())
        return {"round": state["round"] + 1}

    def launch(self, state: ControllerState) -> dict:
        """Start trials (queued proposals first, then the sampler's) until the concurrency or the budget is used."""
        while self._free_slots() > 0 and not self._out_of_time():
            self._start(self.study.ask(self.distributions))
        return {}

    def _start(self, trial: optuna.Trial) -> None:
        """Record on an asked trial what it runs (the dashboard shows it), and launch it on its backend; a trial
        config that does not validate, or a launch the executor cannot make, fails the trial with the reason. Safe
        to repeat: the executor starts a run id once, and a trial keeps the backend it was given first."""
        attributes = TrialAttributes.of(trial)
        source = attributes.source or "sampler"
        fallback = f", in the LLM's turn ({attributes.llm_fallback})" if attributes.llm_fallback else ""
        rationale = attributes.rationale or SAMPLER_RATIONALE + fallback
        candidate = candidate_from_params(trial.params, rationale, source)
        run_id = run_id_of(self.spec, trial)
        backend_url = attributes.backend_url
        if backend_url not in self.backend_urls:  # new, or a local backend that a restarted controller moved
            backend_url = self._least_busy_backend()
        TrialAttributes(run_id=run_id, source=source, rationale=rationale, backend_url=backend_url).write_to(trial)
        warmup = self.warmups.on(backend_url) if self.spec.shared_warmup else None
        if self.spec.shared_warmup and warmup is None:
            self._fail(trial, f"no shared warm-up on {backend_url} to start from")
            return
        try:
            code = code_component_of(self.spec, attributes)
            config = trial_config_of(self.spec, candidate, run_id, warmup.initial_state() if warmup else None, code)
            if code is not None:
                attach_to_trial(trial, code)
        except ConfigurationError as error:
            self._fail(trial, str(error))
            return
        reward_spec = config.reward_spec.model_dump_json()
        TrialAttributes(reward_spec=reward_spec, trial_config=config.model_dump_json()).write_to(trial)
        try:
            self.executor.launch(run_id, config, backend_url)
            self._launched.add(trial.number)
        except ExecutorError as error:
            self._fail(trial, f"could not launch: {error}")

    def _least_busy_backend(self) -> str:
        """The backend running the fewest trials; with a shared warm-up, among those that hold one (a backend added
        to a resumed study gets its warm-up when the next run of the controller starts)."""
        candidates = self.backend_urls
        if self.spec.shared_warmup:
            candidates = tuple(url for url in candidates if self.warmups.on(url) is not None) or candidates
        running = Counter(TrialAttributes.of(t).backend_url for t in self._trials(TrialState.RUNNING))
        return min(candidates, key=lambda url: running[url])

    def monitor(self, state: ControllerState) -> dict:
        """Follow the running trials until one ends (or none runs): report, prune, time out, reconcile."""
        ended_before = len(self._trials(*ENDED))
        while True:
            running = self._trials(TrialState.RUNNING)
            for trial in running:
                self._reconcile(trial)
            self.on_tick(self.study)
            if not self._trials(TrialState.RUNNING) or len(self._trials(*ENDED)) > ended_before:
                return {}
            time.sleep(self.poll_s)

    def analyze(self, state: ControllerState) -> dict:
        """After trials ended, the LLM's short analysis becomes a note on the study (the dashboard shows it)."""
        ended = len(self._trials(*ENDED))
        if self.proposer is None or ended <= state["analysed"]:
            return {"analysed": ended}
        try:
            text = self.proposer.analyze(self.spec, history(self.study), self._baseline())
        except ProposalError as error:
            log.warning("no analysis this round: %s", error)
            return {"analysed": ended}
        record_analysis(self.study, state["round"], text)
        notes = StudyAttributes.of(self.study).analyses
        save_note(self.study, "\n\n".join(f"**Round {i + 1}.** {note}" for i, note in enumerate(notes)))
        return {"analysed": ended}

    def decide(self, state: ControllerState) -> str:
        ended = len(self._trials(*ENDED))
        if ended >= self.spec.budget.trials:
            return "end"
        if self._out_of_time() and not self._trials(TrialState.RUNNING):
            return "end"
        return "propose"

    # --- helpers ----------------------------------------------------------------------------------------------

    def _trials(self, *states: TrialState) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=states)

    def _free_slots(self) -> int:
        started = len(self._trials(TrialState.RUNNING, *ENDED))
        running = len(self._trials(TrialState.RUNNING))
        return max(0, min(self.spec.budget.concurrency - running, self.spec.budget.trials - started))

    def _out_of_time(self) -> bool:
        return time.monotonic() - self.started > self.spec.budget.run_time_limit_s

    def _baseline(self) -> float | None:
        return StudyAttributes.of(self.study).baseline_accuracy

    def _fail(self, trial: optuna.Trial | optuna.trial.FrozenTrial, reason: str) -> None:
        log.warning("trial %d failed: %s", trial.number, reason)
        TrialAttributes(failure=reason).write_to(optuna.trial.Trial(self.study, trial._trial_id))
        self.study.tell(trial.number, state=TrialState.FAIL)

    def _reconcile(self, frozen: optuna.trial.FrozenTrial) -> None:
        """Bring one RUNNING trial in line with its run: launch, report, prune, finish or fail it."""
        run_id = run_id_of(self.spec, frozen)
        try:
            status = self.executor.status(run_id)
        except ExecutorError as error:
            stop_or_warn(self.executor, run_id)  # if the executor answers again, the failed trial does not run on
            self._fail(frozen, f"lost track of the trial: {error}")
            return
        trial = optuna.trial.Trial(self.study, frozen._trial_id)
        metric = self.spec.objective.metric
        try:
            scores = {step: report.score(metric) for step, report in status.evaluations.items()}
            final = status.result.score(metric) if status.phase is TrialPhase.FINISHED else None
        except TaskError as error:
            stop_or_warn(self.executor, run_id)
            self._fail(frozen, str(error))
            return
        for step, score in sorted(scores.items()):
            if step not in frozen.intermediate_values:
                trial.report(score, step)
        if status.evaluations:
            latest = status.evaluations[max(status.evaluations)]
            TrialAttributes(held_out_by_form=latest.accuracy_by_form).write_to(trial)
        reports = {**frozen.intermediate_values, **scores}
        if status.phase is TrialPhase.FINISHED:
            result = status.result
            TrialAttributes(sampler_path=result.sampler_path, held_out_by_form=result.held_out_by_form).write_to(trial)
            values = [final]
            if self.spec.objective.also_minimize:
                values.append(result.wall_time_s)
            self._record_rl_gain(trial, rl_gain_from(reports, final))
            self.study.tell(frozen.number, values)
        elif status.phase is TrialPhase.NOT_STARTED:
            # Asked, then the controller stopped before the launch: record and launch it now.
            self._start(trial)
        elif status.phase is TrialPhase.DIED and frozen.number not in self._launched:
            log.info("trial %d ended with the study's last run; it resumes from its checkpoint", trial.number)
            self._start(trial)
        elif status.phase is TrialPhase.DIED:
            relaunches = TrialAttributes.of(frozen).relaunches
            if relaunches < RELAUNCHES:
                TrialAttributes(relaunches=relaunches + 1).write_to(trial)
                self._start(trial)
            else:
                self._fail(frozen, status.failure or "the trial died")
        elif status.phase is TrialPhase.FAILED:
            self._fail(frozen, status.failure or "the trial failed")
        elif status.started_at is not None and time.time() - status.started_at > self.spec.budget.trial_time_limit_s:
            stop_or_warn(self.executor, run_id)
            self._fail(frozen, f"exceeded the trial time limit of {self.spec.budget.trial_time_limit_s} s")
        elif self.spec.objective.also_minimize is None and trial.should_prune():
            stop_or_warn(self.executor, run_id)
            self._record_rl_gain(trial, rl_gain_from(reports))
            self.study.tell(frozen.number, state=TrialState.PRUNED)

    def _record_rl_gain(self, trial: optuna.Trial, gain: RlGain) -> None:
        """What RL added over the warm-up, as user attributes the dashboard shows (set before the trial ends)."""
        TrialAttributes(held_out_at_rl_start=gain.at_start, rl_gain=gain.gain).write_to(trial)
