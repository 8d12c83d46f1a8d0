"""SQL-first training data with breadth: many schemas, SQL sampled from a grammar, questions written by an LLM.

`python -m tasks.text2sql build-data` builds it; `load_synthesized()` loads the built train split.
"""
