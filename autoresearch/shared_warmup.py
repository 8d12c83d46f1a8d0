"""The shared warm-up, the controller's first node: for a spec with `shared_warmup`, the base trial config's warm-up
runs once on each backend, and every trial on that backend starts its RL from it. Trials then spend their budget on
RL, all from the same start, so their RL gains compare.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import optuna

from autoresearch.attributes import SharedWarmup, StudyAttributes, record_shared_warmup
from autoresearch.controller_state import ControllerState
from autoresearch.errors import ExecutorError, SharedWarmupError
from autoresearch.executors import TrialExecutor, TrialPhase
from autoresearch.executors.base import stop_or_warn
from autoresearch.spec import StudySpec
from autoresearch.trials.run_dir import TrialResult

log = logging.getLogger(__name__)


def shared_warmup_run_id(spec: StudySpec, backend_key: str) -> str:
    """A run id per backend (its URL, or 'local') that stays the same when the spec lists backends in another
    order."""
    return f"{spec.study}-warmup-{hashlib.sha256(backend_key.encode()).hexdigest()[:8]}"


@dataclass(frozen=True, eq=False)
class SharedWarmups:
    """The study's shared warm-ups: the node that runs those missing, and the one a trial on a backend starts from."""

    spec: StudySpec
    study: optuna.Study
    executor: TrialExecutor
    backend_urls: tuple[str, ...]
    on_tick: Callable[[optuna.Study], None]
    poll_s: float

    def on(self, url: str) -> SharedWarmup | None:
        """The finished warm-up on the backend at `url`, or None."""
        return StudyAttributes.of(self.study).shared_warmups.get(self._backend_key(url))

    def run(self, state: ControllerState) -> dict:
        """The node: with `shared_warmup`, run the warm-up on each backend that has none yet and wait for it.

        Raises:
            SharedWarmupError: a warm-up failed (after one relaunch if it died) or ran past the trial time limit.
        """
        if not self.spec.shared_warmup:
            return {}
        pending = {
            url: shared_warmup_run_id(self.spec, self._backend_key(url))
            for url in self.backend_urls
            if self.on(url) is None
        }
        relaunched: set[str] = set()
        limit_s = self.spec.budget.trial_time_limit_s
        for url, run_id in pending.items():
            self._launch(url, run_id)
        while pending:
            for url, run_id in list(pending.items()):
                status = self.executor.status(run_id)
                if status.phase is TrialPhase.FINISHED:
                    self._record(url, run_id, status.result)
                    del pending[url]
                elif status.phase is TrialPhase.DIED and url not in relaunched:
                    relaunched.add(url)
                    self._launch(url, run_id)
                elif status.phase in (TrialPhase.DIED, TrialPhase.FAILED):
                    raise SharedWarmupError(f"the shared warm-up {run_id} failed: {status.failure or 'no reason'}")
                elif status.started_at is not None and time.time() - status.started_at > limit_s:
                    stop_or_warn(self.executor, run_id)
                    raise SharedWarmupError(f"the shared warm-up {run_id} exceeded the trial time limit of {limit_s} s")
            self.on_tick(self.study)
            if pending:
                time.sleep(self.poll_s)
        return {}

    def _launch(self, url: str, run_id: str) -> None:
        config = self.spec.warmup_config(run_id)
        log.info("shared warm-up %s on %s: %d steps", run_id, url, config.warmup_steps)
        try:
            self.executor.launch(run_id, config, url)
        except ExecutorError as error:
            raise SharedWarmupError(f"could not launch the shared warm-up {run_id}: {error}") from None

    def _record(self, url: str, run_id: str, result: TrialResult) -> None:
        warmup = SharedWarmup(
            run_id=run_id,
            path=result.checkpoint_path,
            examples_seen=self.spec.warmup_config(run_id).warmup_examples,
            held_out_accuracy=result.held_out_accuracy,
        )
        log.info("shared warm-up %s: held-out accuracy %.3f, state %s", run_id, warmup.held_out_accuracy, warmup.path)
        record_shared_warmup(self.study, self._backend_key(url), warmup)

    def _backend_key(self, url: str) -> str:
        """What a backend's warm-up is recorded under: its URL, or 'local' for the one a controller starts itself
        (on another port each run, with the same storage)."""
        return url if self.spec.backend_urls else "local"
