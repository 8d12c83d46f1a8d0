"""`python -m support.pipe_echo`: a `tasks.pipe_worker.PipeWorker` child for tests/tasks/test_pipe_worker.py that
prints a line to stdout, as a library might, then answers each message with the message in upper case."""

from __future__ import annotations

from tasks.pipe_worker import ParentPipes

if __name__ == "__main__":
    parent = ParentPipes()
    while (message := parent.receive()) is not None:
        print("a stray line on stdout", flush=True)
        parent.send(message.upper())
