"""vLLM for the tests that need a real vLLM server: its interpreter, and the marks that run those tests together.

vLLM lives in a second virtual environment (its pins clash with ours): `VLLM_PYTHON` names its interpreter, as
`.ci/run` sets it. Without it those tests are skipped here, never in CI (`REQUIRE_VLLM=1`).
"""

from __future__ import annotations

import os

import pytest

VLLM_PYTHON = os.environ.get("VLLM_PYTHON")
if not VLLM_PYTHON and os.environ.get("REQUIRE_VLLM") == "1":
    raise RuntimeError("REQUIRE_VLLM=1 but VLLM_PYTHON does not name vLLM's interpreter")

NEEDS_VLLM = [
    pytest.mark.slow,
    # One worker runs them all (pytest-xdist's loadgroup), so no two vLLM servers share the machine's cores at once.
    pytest.mark.xdist_group("vllm"),
    pytest.mark.skipif(not VLLM_PYTHON, reason="vLLM's environment is not installed here (set VLLM_PYTHON)"),
]
