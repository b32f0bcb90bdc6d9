"""Pure: JSON on the request path (the client's body, the legs' bodies, prefill's answer): orjson where it
is installed (the ``proxy`` extra brings it), else the standard library's json; the same documents either way.

orjson parses a 2000-token prompt in about 40 % of json's time and writes a leg's body in 5 %
(docs/benchmarks.md, "Proxy against vllm-router"). Both refuse what is not JSON (``NaN``, ``Infinity``);
orjson also refuses a lone UTF-16 surrogate escape and reads an integer past 64 bits as a float, which only
ever changes a request the engine would refuse anyway.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_orjson_loads: Callable[[bytes | bytearray | str], Any] | None
_orjson_dumps: Callable[[Any], bytes] | None
try:
    import orjson

    _orjson_loads, _orjson_dumps = orjson.loads, orjson.dumps
except ImportError:  # installed without the proxy extra
    _orjson_loads = _orjson_dumps = None

_compact = json.JSONEncoder(separators=(",", ":")).encode  # one encoder: json.dumps builds one per call


def _not_a_number(token: str) -> Any:
    """NaN, Infinity and -Infinity: Python's json reads them, but they are not JSON (RFC 8259 6)."""
    raise ValueError(f"{token} is not a JSON number")


def loads(data: bytes | bytearray | str) -> Any:
    """A JSON document; ValueError (json's and orjson's decode errors are ValueErrors) when it is not one,
    RecursionError when it nests too deeply. What is refused is told in json's words (``NaN is not a JSON
    number``, where orjson says only where it stopped): json reads it again on that path alone."""
    if _orjson_loads is None:
        return _strict_loads(data)
    try:
        return _orjson_loads(data)
    except ValueError:
        _strict_loads(data)  # raises json's error wherever json refuses the document too
        raise  # what json accepts and orjson refuses (a lone surrogate escape) stays refused


def _strict_loads(data: bytes | bytearray | str) -> Any:
    return json.loads(data, parse_constant=_not_a_number)


def engine_loads(data: bytes | bytearray | str) -> Any:
    """An engine's JSON as Python's json reads it: with ``NaN`` and ``Infinity``, which a Python engine
    may write (orjson first; json when orjson refuses)."""
    if _orjson_loads is not None:
        try:
            return _orjson_loads(data)
        except ValueError:
            pass
    return json.loads(data)


def dumps(document: Any) -> bytes:
    """Compact JSON bytes (no spaces) of a document ``loads`` read (orjson would write NaN as null)."""
    if _orjson_dumps is not None:
        try:
            return _orjson_dumps(document)
        except TypeError:  # an integer past 64 bits, say: json writes it
            pass
    return _compact(document).encode()
