"""The tenancy policy file that `pdctl operator` and `pdctl render` read (``--policy FILE``: the chart's
``policy:`` values in its ConfigMap), read here so that pd_operator.policy stays pure."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from pd_operator.policy import DEFAULT_POLICY, TenancyPolicy


class PolicyError(ValueError):
    """A policy file that cannot be read or does not parse."""


def read(path: Path | None) -> TenancyPolicy:
    """The policy in the YAML file ``path`` (None, or an empty file: the defaults); raises
    :class:`PolicyError`."""
    if path is None:
        return DEFAULT_POLICY
    try:
        return TenancyPolicy.model_validate(yaml.safe_load(path.read_text()) or {})
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise PolicyError(f"cannot read the tenancy policy {path}: {exc}") from exc
