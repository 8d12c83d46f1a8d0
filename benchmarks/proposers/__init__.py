"""Do the proposers earn their place? Random search, TPE, the LLM alone and the hybrid sampler compared on a tabular
benchmark of real trial outcomes (issue 40 §4): `python -m benchmarks.proposers build` runs the grid of real trials
once and writes the table; the arms then query the table instead of training.
"""
