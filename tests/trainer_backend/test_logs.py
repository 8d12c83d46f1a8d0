"""Logs are structured: one JSON object a line with the operation's fields, or text with key=value pairs."""

from __future__ import annotations

import json
import logging

from trainer_backend.logs import JsonFormatter, TextFormatter


def record_with_fields() -> logging.LogRecord:
    record = logging.LogRecord("trainer_backend.scheduler", logging.INFO, __file__, 1, "operation %s", ("done",), None)
    record.request_id = "req-1"
    record.run_s = 0.25
    return record


def test_json_lines_carry_the_message_and_every_extra_field() -> None:
    entry = json.loads(JsonFormatter().format(record_with_fields()))
    assert entry["msg"] == "operation done"
    assert entry["level"] == "info"
    assert entry["logger"] == "trainer_backend.scheduler"
    assert entry["request_id"] == "req-1"
    assert entry["run_s"] == 0.25
    assert entry["ts"].endswith("Z")


def test_text_lines_append_extra_fields_as_pairs() -> None:
    line = TextFormatter().format(record_with_fields())
    assert "operation done" in line
    assert line.endswith("request_id=req-1 run_s=0.25")
