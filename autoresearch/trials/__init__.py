"""RL trials: a GRPO-style loop over the Tinker API that trains a LoRA adapter and reports a held-out score."""

from autoresearch.trials.config import TrialConfig, load_trial_config, parse_trial_config
from autoresearch.trials.evaluation import evaluate_checkpoint
from autoresearch.trials.rl_loop import EvalCallback, run_trial
from autoresearch.trials.run_dir import TrialResult
from tasks.report import HeldOutReport

__all__ = [
    "EvalCallback",
    "HeldOutReport",
    "TrialConfig",
    "TrialResult",
    "evaluate_checkpoint",
    "load_trial_config",
    "parse_trial_config",
    "run_trial",
]
