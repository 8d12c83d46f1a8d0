"""Each trial's share of the device, as its backend's status tells it.

A trial creates its training runs with its run id in their user_metadata (`TRIAL_METADATA_KEY`), and
`GET /api/v1/status` lists the caller's recently active runs with their device time; sampling from a run's sampler
weights, and sampling the base model through the client session that trains the run (a KL penalty's reference
log-probs), counts toward the run, so a trial's figure covers its sampling, scoring, training and saves. Trials
share one API key, so the key's own usage could not tell them apart. A backend that does not answer, or answers
without `runs` (one that is not this project's), leaves its trials without a figure: the view is a convenience, never
a reason to stop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from autoresearch.trials.backend import TRIAL_METADATA_KEY

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceUse:
    """A trial's share of its backend's device over about the last minute, its device seconds in all, and its
    requests queued or running there now."""

    share_1m: float
    seconds: float
    open_requests: int = 0


class _Run(BaseModel):
    user_metadata: dict[str, Any] | None = None
    device_seconds: float
    device_share_1m: float
    open_requests: int = 0  # absent from backends older than the field


class _Status(BaseModel):
    runs: list[_Run]


def device_use_by_trial(backend_urls: Sequence[str], api_key: str, timeout_s: float = 2.0) -> dict[str, DeviceUse]:
    """Device use by trial run id, summed over each trial's runs (a resumed trial has one per start), from the status
    of every backend in `backend_urls`."""
    found: dict[str, DeviceUse] = {}
    for url in backend_urls:
        try:
            reply = httpx.get(f"{url}/api/v1/status", headers={"X-API-Key": api_key}, timeout=timeout_s)
            reply.raise_for_status()
            status = _Status.model_validate_json(reply.content)
        except (httpx.HTTPError, ValidationError) as error:
            log.debug("no device shares from %s: %s", url, error)
            continue
        for run in status.runs:
            trial = (run.user_metadata or {}).get(TRIAL_METADATA_KEY)
            if trial is None:
                continue
            before = found.get(str(trial), DeviceUse(0.0, 0.0))
            found[str(trial)] = DeviceUse(
                before.share_1m + run.device_share_1m,
                before.seconds + run.device_seconds,
                before.open_requests + run.open_requests,
            )
    return found
