"""The kinds of request the server records as futures and runs on the device.

A kind's value is what the ledger stores, what `/metrics` labels operations with and what the status shows; being a
`StrEnum`, a kind is that string wherever it goes.
"""

from __future__ import annotations

from enum import StrEnum


class RequestKind(StrEnum):
    CREATE_MODEL = "create_model"
    FORWARD = "forward"
    FORWARD_BACKWARD = "forward_backward"
    OPTIM_STEP = "optim_step"
    SAVE_WEIGHTS = "save_weights"
    SAVE_WEIGHTS_FOR_SAMPLER = "save_weights_for_sampler"
    LOAD_WEIGHTS = "load_weights"
    SAMPLE = "sample"
