"""What the agentic tests (tests/text2sql/test_agentic*.py) score their episodes with."""

from __future__ import annotations

from tasks.text2sql.reward.rewards import RewardSpec

# The answer's match and whether it runs, a penalty per turn, per failed exploration and for no answer at all.
EPISODE_REWARD = RewardSpec.parse(
    {
        "components": [
            {"kind": "execution_match", "weight": 1.0},
            {"kind": "executes", "weight": 0.1},
            {"kind": "turn_penalty", "weight": 0.05},
            {"kind": "failed_exploration", "weight": 0.2},
            {"kind": "unanswered", "weight": 1.0},
        ]
    }
)
