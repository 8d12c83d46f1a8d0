"""Batch-invariant sampling: which requests are answered as if they were alone on the server.

A row's logits in a generation batch are sums whose order and blocking depend on the batch's shape: how many rows,
how long the longest prompt, which rows joined between decode steps (continuous batching). So the same greedy request
can get a different answer beside other work, in bf16 often enough to move a held-out score (issue 40: one checkpoint
scored 34.4% and 35.9%). A batch-invariant request runs as a generation batch of its own rows only, which takes
nothing in and joins nothing (`Operation.alone`): its answer is what it gets alone, bit for bit, whatever else the
server runs, at the price of not sharing decode steps with other requests.

A Tinker client asks for it for a whole session, in the session's `user_metadata` (`tinker.ServiceClient(
user_metadata={"batch_invariant": "greedy"})`), which covers every sampler created in the session, named or
ephemeral; an OpenAI-compatible request, with the body field `"batch_invariant": true`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from trainer_backend.engine.types import SamplingRequest
from trainer_backend.errors import UserInputError

# The session user_metadata key that asks for it.
BATCH_INVARIANT_KEY = "batch_invariant"
# off: every request batches; greedy: requests at temperature 0 (evaluations) run alone, sampled ones (RL rollouts,
# whose answers are random anyway) batch; all: every request runs alone.
BatchInvariance = Literal["off", "greedy", "all"]


def session_batch_invariance(user_metadata: Mapping[str, Any] | None) -> BatchInvariance:
    """The batch invariance a new session's `user_metadata` asks for; "off" when it names none.

    Raises:
        UserInputError: the key holds something other than one of the modes.
    """
    value = (user_metadata or {}).get(BATCH_INVARIANT_KEY, "off")
    modes = get_args(BatchInvariance)
    if value not in modes:
        raise UserInputError(
            f"user_metadata {BATCH_INVARIANT_KEY!r} must be one of {', '.join(modes)} (greedy: the session's "
            f"temperature-0 requests are answered as if alone on the server), got {value!r}"
        )
    return value


def runs_alone(mode: BatchInvariance, request: SamplingRequest) -> bool:
    """Whether a request of a session in `mode` is answered as if alone on the server."""
    return mode == "all" or (mode == "greedy" and request.temperature == 0)
