"""Just enough PromQL to list the metric names a query selects (for the dashboard test).

A metric name is an identifier (letters, digits, '_' and ':') that is not a function call, an
aggregation operator, a keyword or a label name. Label matchers (``{...}``), ranges and subqueries
(``[...]``), strings and the label lists after ``by``/``without``/``on``/``ignoring``/``group_left``/
``group_right`` are skipped; Grafana variables (``$name``, ``${name}``) only ever appear inside those.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      |(?P<duration>(?:\d+(?:ms|[smhdwy]))+)
      |(?P<number>\d+(?:\.\d+)?(?:e[+-]?\d+)?)
      |(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
      |(?P<var>\$\{?\w+\}?)
      |(?P<punct>[(){}\[\],])
      |(?P<op>[-+*/%^=!<>~]+)
      |(?P<space>\s+)""",
    re.VERBOSE,
)
AGGREGATIONS = frozenset(
    [
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ]
)
KEYWORDS = frozenset(["and", "or", "unless", "bool", "offset", "inf", "nan"])
LABEL_LISTS = frozenset(["by", "without", "on", "ignoring", "group_left", "group_right"])
_CLOSING = {"{": "}", "[": "]", "(": ")"}


class PromQLSyntaxError(ValueError):
    pass


def tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None:
            raise PromQLSyntaxError(f"unexpected {expr[pos : pos + 10]!r} at {pos} in {expr!r}")
        kind = match.lastgroup or ""
        if kind != "space":
            out.append((kind, match.group()))
        pos = match.end()
    return out


def _skip_group(toks: list[tuple[str, str]], start: int) -> int:
    """Index after the bracketed group opening at ``start`` (nesting of the same bracket counted)."""
    opening = toks[start][1]
    depth = 0
    for i in range(start, len(toks)):
        if toks[i] == ("punct", opening):
            depth += 1
        elif toks[i] == ("punct", _CLOSING[opening]):
            depth -= 1
            if depth == 0:
                return i + 1
    raise PromQLSyntaxError(f"unclosed {opening!r}")


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects."""
    toks = tokens(expr)
    names: set[str] = set()
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        following = toks[i + 1] if i + 1 < len(toks) else ("", "")
        if kind == "punct" and text in ("{", "["):
            i = _skip_group(toks, i)
            continue
        if kind == "ident" and text in LABEL_LISTS:
            i = _skip_group(toks, i + 1) if following == ("punct", "(") else i + 1
            continue
        if kind == "ident" and following != ("punct", "(") and text not in AGGREGATIONS | KEYWORDS:
            names.add(text)
        i += 1
    return names


def label_values_metrics(query: str) -> set[str]:
    """Metric names of a Grafana ``label_values(<selector>, <label>)`` variable query."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query)
    if match is None:
        raise PromQLSyntaxError(f"not a label_values query: {query!r}")
    return metric_names(match.group(1))
