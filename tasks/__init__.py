"""RL tasks: environments that turn dataset rows into prompts and completions into rewards."""
