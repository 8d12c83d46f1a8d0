"""Reward components written as code, by an LLM or a person, and admitted only after three checks.

A task that takes code rewards (`admission.CodeRewardTask`) documents the function's signature and builds its probe
batch; this package does what every such task shares:

- `static_check`: the source is parsed, and refused unless it uses only allowed syntax, imports only allowed
  modules, calls none of the builtins that reach outside (open, eval, getattr...) and touches no attribute that
  starts with `_`.
- `sandbox`: the function runs in a worker process of its own, a fresh interpreter with a stripped set of builtins,
  under CPU-time, address-space and wall-clock limits; whatever it does, the caller gets a number or a reason.
- `admission`: the static check, then the task's gate on its probe batch (right answers must score above wrong
  ones), giving a `Verdict` with the reason and the numbers.
- `loading`: code stored as an Optuna artifact is loaded by its sha256 (checked) and run in a sandbox kept per hash,
  which is how a trial's reward component calls it.

Nothing here imports a task's package or the trial code, and the worker imports only the standard library.
"""
