"""Kubernetes resource quantities (``3k``, ``512Mi``, ``1e9``, ``500m``), parsed once, here.

The grammar is apimachinery's ``resource.Quantity``
(https://github.com/kubernetes/apimachinery/blob/master/pkg/api/resource/quantity.go): a
decimal number with an optional exponent, then a binary (``Ki``..``Ei``) or decimal (``m``,
``k``..``E``) suffix. The API server stores quantities in canonical form, so what a user wrote
as ``16000`` comes back as ``16k``: every comparison of quantities goes through these
functions, never through the text. Pure, no I/O.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Final

MiB: Final = 1024 * 1024  # bytes in a mebibyte

_QUANTITY = re.compile(r"^\s*([+]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?\s*$")
_SUFFIX: Final = {None: Decimal(1), "m": Decimal("0.001"), "k": Decimal(10) ** 3,
                  "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
                  "P": Decimal(10) ** 15, "E": Decimal(10) ** 18, "Ki": Decimal(2) ** 10,
                  "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
                  "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60}
#: "No matter which of the three exponent forms is used, no quantity may represent a number
#: greater than 2^63-1 in magnitude" (quantity.go); larger text is not a quantity.
_LIMIT: Final = Decimal(2**63 - 1)


def quantity_value(value: Any) -> Decimal | None:
    """A Kubernetes quantity (``3k``, ``3000``, ``512Mi``) as a number; None when it is not
    one (including numbers past 2^63-1, which the API server refuses)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    text = str(value)
    if len(text) > 64:  # longer than any valid quantity: no Decimal work on hostile input
        return None
    match = _QUANTITY.match(text)
    if match is None:
        return None
    try:
        number = Decimal(match.group(1)) * _SUFFIX[match.group(2)]
    except (InvalidOperation, ArithmeticError):
        return None
    return number if abs(number) <= _LIMIT else None


def integer_quantity(value: Any) -> int | None:
    """A whole-number quantity (extended resources such as ``nvidia.com/gpu`` or
    ``gpu-admission.io/gpu-memory`` must be integers: ``4096``, ``16k``, ``4Gi``) as an int;
    None when it is not a quantity or not whole (``1.5``, ``500m``)."""
    if value.__class__ is int:  # JSON numbers: the common case, no string work
        return int(value)
    if isinstance(value, str) and len(value) <= 18 and value.isdigit() and value.isascii():
        return int(value)
    number = quantity_value(value)
    if number is None or number != number.to_integral_value():
        return None
    return int(number)


def quantity_mib(value: Any) -> int | None:
    """A Kubernetes quantity (``10Gi``, ``512Mi``, ``8G``) in whole MiB, rounded down as the
    NVIDIA driver does (``bytes/1024/1024``); None when it is not a positive quantity."""
    number = quantity_value(value)
    if number is None:
        return None
    try:
        mib = int(number // MiB)
    except (InvalidOperation, ArithmeticError):
        return None
    return mib if mib >= 1 else None
