"""Agentic text-to-SQL: the policy may run exploratory queries, read their results or errors, then answer.

`turns.py` holds the text format of a turn and of what the environment answers; `episode.py` one episode's state
and rules; `prompts.py` the prompt that explains the format with solved examples.
"""
