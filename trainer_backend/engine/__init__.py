"""The device side: one base model, LoRA adapters with their optimizers, losses, and sampling."""
