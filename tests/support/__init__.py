"""What tests of every package share: loopback servers and ports, and the tiny model's server config."""
