"""Pure: Kubernetes resource quantities (the subset api.shared.Quantity admits) as exact numbers, and back.

The operator adds quantities (a memory request = the /dev/shm size + a margin) and compares them (a
default limit never below the user's request); Decimal keeps "1.5Gi" and "100m" exact.
"""

from __future__ import annotations

import re
from decimal import Decimal

_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
}
_QUANTITY = re.compile(r"^(?P<number>[0-9]+(\.[0-9]+)?)(?P<suffix>Ki|Mi|Gi|Ti|Pi|k|M|G|T|P|m)?$")


def parse(quantity: str) -> Decimal:
    """``"32Gi"`` -> 34359738368; raises ValueError for anything api.shared.Quantity would refuse."""
    found = _QUANTITY.match(quantity)
    if found is None:
        raise ValueError(f"not a quantity: {quantity!r}")
    return Decimal(found["number"]) * _SUFFIX[found["suffix"] or ""]


def format_bytes(value: Decimal) -> str:
    """Bytes in the largest binary unit that keeps them whole (``"96Gi"``, ``"1088Mi"``, ``"100"``)."""
    for suffix in ("Ti", "Gi", "Mi", "Ki"):
        unit = _SUFFIX[suffix]
        if value >= unit and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value.to_integral_value())


def larger(a: str, b: str) -> str:
    return a if parse(a) >= parse(b) else b


def smaller(a: str, b: str) -> str:
    return a if parse(a) <= parse(b) else b
