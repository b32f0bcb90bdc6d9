"""Self-contained HTML pages from the Jinja2 templates in ``pd_runtime/templates`` (package data).

One environment with autoescaping for every report (`pdctl plan --report`, `pdctl bench --report`);
charts arrive as inline SVG strings the templates insert with `|safe` (svgcharts escapes every label).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

_ENV = Environment(
    loader=PackageLoader("pd_runtime", "templates"),
    autoescape=select_autoescape(["html", "j2"]),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def render(template: str, **context: Any) -> str:
    return _ENV.get_template(template).render(**context)


def package_version() -> str:
    """pd-operator's installed version, printed in every page's footer."""
    try:
        return version("pd-operator")
    except PackageNotFoundError:
        return "unknown"
