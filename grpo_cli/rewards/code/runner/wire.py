"""What travels between the trainer and the runner, in both directions, and why the candidate
cannot forge it.

In: length-prefixed marshal frames on stdin (the header, then `{"id": n, "args": (...),
"kwargs": {...}}` per call; trusted data, and marshal is built in, where importing json costs a
third of a session). Out: newline-delimited JSON records on PROTO_FD, which the trainer parses as
hostile input: a hello (`id` -1, sent before any candidate code runs, so a process that dies earlier
is the harness's fault), `ready` (`id` 0), then exactly one response per request. The candidate
shares the worker's process and can write to that pipe too; it gains nothing: the trainer reads
records strictly in order, fails the completion on any extra or malformed one, and never reads a
verdict, only values, which it decodes itself and compares with expectations the sandbox never sees.

Values leave in a typed JSON encoding (`encode`/`decode`) that admits only exact builtin types:
`type(v) is int`, never `isinstance`, so no `__eq__` override can reach the trainer. Stdlib only
(Python >= 3.8): the trainer imports it from grpo_cli, the sandbox from its copy of the runner.
"""

from __future__ import annotations

import marshal
import math
from _json import encode_basestring_ascii as _quote  # C; the json package would pull in re, enum, ...

MAX_DEPTH = 64  # nesting of a value; deeper (or cyclic) results are not plain data
BIG_INT_BITS = 4000  # larger ints travel as hex: decimal str<->int is capped at 4300 digits since 3.11
HELLO_ID = -2  # the pre-warmed server's first record on the control socket


class NotPlainData(ValueError):
    """A value that is not made of exact builtin types."""


def type_name(value: object) -> str:
    try:  # `type.__name__` read through `type` itself: a metaclass cannot override it
        return str(type.__dict__["__name__"].__get__(type(value), type))
    except Exception:
        return "?"


def encode(value: object, depth: int = 0) -> object:
    """Exact builtin values -> JSON-ready data; anything else raises NotPlainData.

    >>> encode([1, 2.5, "a", None, True, (1,), {1: b"x"}])
    [1, 2.5, 'a', None, True, {'t': [1]}, {'d': [[1, {'b': '78'}]]}]
    >>> encode(type("Int", (int,), {})(1))  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    NotPlainData: Int is not a builtin value
    """
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is float:
        return value
    if kind is int:
        return value if value.bit_length() <= BIG_INT_BITS else {"x": hex(value)}
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple:
        return {"t": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is set:
        return {"s": [encode(v, depth + 1) for v in value]}
    if kind is frozenset:
        return {"f": [encode(v, depth + 1) for v in value]}
    raise NotPlainData(f"{type_name(value)} is not a builtin value")


def to_json(data: object) -> str:
    r"""JSON text for `encode`'s output (and records made of it), the way `json.dumps` writes it.

    >>> to_json({"id": 1, "ok": [None, True, -2, 0.5, float("nan"), "\u00e9", {"t": []}]})
    '{"id": 1, "ok": [null, true, -2, 0.5, NaN, "\\u00e9", {"t": []}]}'
    """
    kind = type(data)
    if kind is str:
        return _quote(data)
    if data is None:
        return "null"
    if kind is bool:
        return "true" if data else "false"
    if kind is int:
        return int.__repr__(data)
    if kind is float:
        if math.isfinite(data):
            return float.__repr__(data)
        return "NaN" if data != data else "Infinity" if data > 0 else "-Infinity"
    if kind is list:
        return "[" + ", ".join([to_json(v) for v in data]) + "]"
    if kind is dict:
        return "{" + ", ".join([_quote(k) + ": " + to_json(v) for k, v in data.items()]) + "}"
    raise NotPlainData(f"{type_name(data)} has no JSON form")


def frame(value: object) -> bytes:
    """One length-prefixed marshal frame (the trainer's side of the job pipe)."""
    data = marshal.dumps(value, 4)  # format 4 reads on every Python >= 3.4
    return b"%d\n" % len(data) + data


def read_frame(reader: object) -> object:
    """The next frame from `reader`; None at EOF."""
    line = reader.readline()
    if not line:
        return None
    size = int(line)
    data = reader.read(size)
    if len(data) != size:
        return None
    return marshal.loads(data)


def decode(data: object, depth: int = 0) -> object:
    """Inverse of `encode`, strict: malformed input raises ValueError (the trainer decodes hostile data).

    >>> decode({"t": [1, {"d": [[{"t": []}, {"b": "ff"}]]}, {"x": "-0x10"}]})
    (1, {(): b'\\xff'}, -16)
    >>> decode({"t": [1], "extra": 2})
    Traceback (most recent call last):
    ...
    ValueError: malformed value
    """
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(data)
    if data is None or kind is bool or kind is int or kind is float or kind is str:
        return data
    if kind is list:
        return [decode(v, depth + 1) for v in data]
    if kind is dict and len(data) == 1:
        ((tag, payload),) = data.items()
        if type(payload) is str:
            if tag == "x":
                return int(payload, 16)
            if tag == "b":
                return bytes.fromhex(payload)
        elif type(payload) is list:
            items = [decode(v, depth + 1) for v in payload]
            try:
                if tag == "t":
                    return tuple(items)
                if tag == "s":
                    return set(items)
                if tag == "f":
                    return frozenset(items)
                if tag == "d" and all(type(p) is list and len(p) == 2 for p in items):
                    return {k: v for k, v in items}
            except TypeError as err:  # an unhashable key or member
                raise ValueError(f"malformed value: {err}") from None
    raise ValueError("malformed value")
