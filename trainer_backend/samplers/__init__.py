"""The engines that answer sampling requests, behind one `Sampler` interface: the built-in engine (the shared
generation batches of the device queue) and vLLM (a server of its own), routed per request."""
