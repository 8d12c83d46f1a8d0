"""Where trials run: `LocalExecutor` (subprocesses of this machine) or `KubernetesExecutor` (Jobs in a cluster)."""

from autoresearch.executors.base import TrialExecutor, TrialPhase, TrialStatus
from autoresearch.executors.local import LocalExecutor

__all__ = ["LocalExecutor", "TrialExecutor", "TrialPhase", "TrialStatus"]
