"""Self-hosted, Tinker-compatible LoRA training server: one base model, many adapters, one scheduler."""
