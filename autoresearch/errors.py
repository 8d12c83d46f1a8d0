"""Typed errors of autoresearch, in one place: a trial's (a bad config, a broken backend, a run that cannot resume)
and the study's (an executor, the LLM proposer, a candidate outside the search space, a shared warm-up)."""


class AutoresearchError(Exception):
    """Base class of every error autoresearch raises on purpose, a trial's or the study's."""


class TrialError(AutoresearchError):
    """Base class of every error a trial raises on purpose."""


class ConfigurationError(TrialError):
    """A trial config does not validate, or does not fit the data set it runs on."""


class ResumeError(TrialError):
    """A run directory cannot be resumed: its state is unreadable or it was started with another config."""


class BackendStartError(TrialError):
    """The local training backend did not come up."""


class BackendResponseError(TrialError):
    """The backend answered without something the trial asked for."""


class SharedWarmupError(TrialError):
    """The warm-up every trial starts from could not be run; the study cannot go on without it."""


class ProposalError(AutoresearchError):
    """The LLM's reply could not be used (unreachable endpoint, no key, malformed output); the message says why."""


class SlowProposalError(ProposalError):
    """The LLM did not answer within its timeout."""


class MalformedProposalError(ProposalError):
    """The LLM answered, but not with a proposal of the expected shape (or it was cut off)."""


class CandidateError(AutoresearchError):
    """A proposed candidate does not fit the search space; the message says which value and why."""


class ExecutorError(TrialError):
    """The executor could not do what was asked (its API did not answer, or refused)."""
