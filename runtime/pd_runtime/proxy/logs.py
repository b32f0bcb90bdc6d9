"""Log setup: key=value text for people, or one JSON object per line for log pipelines."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Literal

LogFormat = Literal["text", "json"]
# Structured fields the proxy attaches with ``extra=``; the JSON formatter lifts them to top-level keys.
STRUCTURED_FIELDS = ("transfer_id", "outcome")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class SecondStampFormatter(logging.Formatter):
    """logging.Formatter whose timestamp is ``strftime``'d once a second, not once a record: the proxy logs
    a line per request, and the per-record ``localtime`` + ``strftime`` showed in its profile. The text is
    the same as logging.Formatter's (the milliseconds appended when no ``datefmt`` is given)."""

    def __init__(self, fmt: str | None = None) -> None:
        super().__init__(fmt)
        self._stamps: dict[str | None, tuple[int, str]] = {}  # datefmt -> (second, its strftime)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        cached = self._stamps.get(datefmt)
        if cached is None or cached[0] != second:
            stamp = time.strftime(datefmt or self.default_time_format, self.converter(record.created))
            cached = self._stamps[datefmt] = (second, stamp)
        if datefmt:
            return cached[1]
        return self.default_msec_format % (cached[1], record.msecs) if self.default_msec_format else cached[1]


class JsonFormatter(SecondStampFormatter):
    def format(self, record: logging.LogRecord) -> str:
        document = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        document.update({key: getattr(record, key) for key in STRUCTURED_FIELDS if hasattr(record, key)})
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document)


def configure(level: str, fmt: LogFormat) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(SecondStampFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The logging HOWTO's "Optimization": no caller lookup (a stack walk per record) and no thread or
    # process names. The formats above use none of them, and the proxy logs one line per request.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
