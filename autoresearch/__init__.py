"""The autoresearch controller: an LLM proposes RL trial variants through Optuna and reads their results."""
