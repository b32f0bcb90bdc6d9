"""The log formatters: the once-a-second timestamp gives the text logging.Formatter gives."""

from __future__ import annotations

import json
import logging

from pd_runtime.proxy.logs import TEXT_FORMAT, JsonFormatter, SecondStampFormatter


def _record(created: float) -> logging.LogRecord:
    record = logging.LogRecord("pd_runtime.proxy.flows", logging.INFO, "", 0, "request done outcome=%s", ("ok",), None)
    record.created, record.msecs = created, (created - int(created)) * 1000
    return record


def test_text_lines_match_logging_formatter_within_and_across_seconds() -> None:
    ours, reference = SecondStampFormatter(TEXT_FORMAT), logging.Formatter(TEXT_FORMAT)
    for created in (1764640000.125, 1764640000.9, 1764640001.0, 1764640000.5, 1764643600.25):
        record = _record(created)
        assert ours.format(record) == reference.format(record)


def test_json_time_follows_each_second() -> None:
    formatter = JsonFormatter()
    first, same, later = (json.loads(formatter.format(_record(t))) for t in (1764640000.1, 1764640000.8, 1764640002.0))
    reference = logging.Formatter()
    assert first["time"] == same["time"] == reference.formatTime(_record(1764640000.1), "%Y-%m-%dT%H:%M:%S%z")
    assert later["time"] == reference.formatTime(_record(1764640002.0), "%Y-%m-%dT%H:%M:%S%z")
    assert first["message"] == "request done outcome=ok"
