"""The HTTP layer, above the service: the FastAPI routes of the Tinker API (`app`) and the Prometheus metrics
(`metrics`). The bodies it reads and writes are defined in `trainer_backend.wire`."""
