"""The reward: its spec and components, the scorer that judges a completion, and components written as code."""
