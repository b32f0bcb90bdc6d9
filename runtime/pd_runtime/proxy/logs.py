"""Log setup: key=value text for people, or one JSON object per line for log pipelines."""

from __future__ import annotations

import json
import logging
import sys
from typing import Literal

LogFormat = Literal["text", "json"]
# Structured fields the proxy attaches with ``extra=``; the JSON formatter lifts them to top-level keys.
STRUCTURED_FIELDS = ("transfer_id", "outcome")


class JsonFormatter(logging.Formatter):
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
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The logging HOWTO's "Optimization": no caller lookup (a stack walk per record) and no thread or
    # process names. The formats above use none of them, and the proxy logs one line per request.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
