"""The Kubernetes CEL library functions our rules use that the Python `cel` package lacks.

Messages are built with `'…%s…'.format([…])` rather than `'…' + string(x)`: the apiserver's
cost estimator treats `string(int)` as unbounded and refuses the CRD, while `format` is
costed by its template. Only the `%s` and `%%` verbs are used, and `%s` of a double must
print what cel-go prints (Go's shortest `%g` form: `3`, `0.001`, `1e-06`, `123456`).
"""

from __future__ import annotations

import decimal
import re
from typing import Any

import cel

_VERB = re.compile(r"%(%|s)")


def go_double(value: float) -> str:
    """strconv.FormatFloat(value, 'g', -1, 64): shortest digits, exponent form outside [1e-4, 1e6)."""
    if value != value or value in (float("inf"), float("-inf")):
        return {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}[repr(value)]
    if value == 0:
        return "-0" if repr(value).startswith("-") else "0"
    sign, digits, exponent = decimal.Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    point = len(text) + exponent  # position of the decimal point in `text`
    power = point - 1
    if power < -4 or power >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        out = f"{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"
    elif point <= 0:
        out = "0." + "0" * -point + text
    elif point >= len(text):
        out = text + "0" * (point - len(text))
    else:
        out = text[:point] + "." + text[point:]
    return ("-" if sign else "") + out


def _as_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_double(value)
    return str(value)


def format_string(template: str, args: list[Any]) -> str:
    """cel-go's `strings.format` for the verbs `%s` and `%%`."""
    values = iter(args)
    return _VERB.sub(lambda m: "%" if m.group(1) == "%" else _as_string(next(values)), template)


def context(variables: dict[str, Any]) -> cel.Context:
    ctx = cel.Context()
    ctx.add_function("format", format_string)
    ctx.add_function("sum", sum)  # the Kubernetes lists library's `list.sum()`
    ctx.update(variables)
    return ctx
