"""What tests of every package share: loopback servers and ports, the tiny model's server config, helpers to drive
the training server, and vLLM's environment."""
