"""What tests of several packages share: loopback servers and ports, the tiny model's server config, helpers to drive
the training server, adapters trained a few steps, tiny random models built in memory, vLLM's environment, and the
stand-ins at the boundaries no test can reach (an LLM, the Kubernetes Jobs API, a PostgreSQL server), with the
studies, trials and hostile SQL the tests run through them."""
