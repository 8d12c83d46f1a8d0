"""Typed errors of a trial, so a caller can tell a bad config from a broken backend or a run that cannot resume."""


class TrialError(Exception):
    """Base class of every error a trial raises on purpose."""


class ConfigurationError(TrialError):
    """A trial config does not validate, or does not fit the data set it runs on."""


class CheckpointError(TrialError):
    """A run directory cannot be resumed: its state is unreadable or it was started with another config."""


class BackendStartError(TrialError):
    """The local training backend did not come up."""


class BackendResponseError(TrialError):
    """The backend answered without something the trial asked for."""
