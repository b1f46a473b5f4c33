"""Config dataclasses that validate themselves on construction: field types (typeguard) and
value ranges, with errors that are one sentence naming the field, the value and what was
expected. The configs in `pd.train.config`, `pd.train.schedule` and `pd.targets.configs`
inherit `Validated`; TOML files and `--set` overrides reach the same checks through their
constructors (`pd.train.config.from_dict`).
"""

import dataclasses
import math
import typing
from typing import ClassVar, Literal

from typeguard import TypeCheckError, check_type


class ConfigError(ValueError):
    """A bad configuration, described in one sentence."""


class FieldError(ConfigError):
    """A bad value at `key`, a dotted path relative to the config that found it."""

    def __init__(self, key: str, value: object, expected: str, *, show_type: bool = False) -> None:
        self.key, self.value, self.expected, self.show_type = key, value, expected, show_type
        shown = f"{value!r} ({type(value).__name__})" if show_type else repr(value)
        super().__init__(f"config key '{key}' is {shown}, expected {expected}")

    def under(self, prefix: str) -> "FieldError":
        """The same error with its key under `prefix` (the path of the config that raised it)."""
        key = f"{prefix}.{self.key}" if prefix else self.key
        return FieldError(key, self.value, self.expected, show_type=self.show_type)


class Validated:
    """Base of the config dataclasses: construction checks every field's type with typeguard,
    turns ints given for float fields into floats, and checks ranges. Integers must be positive
    unless named in `NON_NEGATIVE`, and at most 2**31 - 1 (int32: sizes and counts become int32
    shapes, indices and step counters in XLA, with jax's x64 off), or 2**32 - 1 when named in
    `SEEDS` (the 32 bits `jax.random.key` keeps with x64 off: seed 2**32 is seed 0 again);
    floats must be finite and non-negative, and in [0, 1] when named in `FRACTIONS` (a tuple
    field's rule applies to each item). Subclasses with rules across fields extend
    `__post_init__`."""

    NON_NEGATIVE: ClassVar[frozenset[str]] = frozenset()
    FRACTIONS: ClassVar[frozenset[str]] = frozenset()
    SEEDS: ClassVar[frozenset[str]] = frozenset({"seed"})
    # Set by @dataclass on every subclass; declared so that `dataclasses.fields(self)` type-checks.
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[object]]]
    # Keeps jaxtyping's test-time hook from checking `__init__`'s arguments, which would refuse
    # an int for a float and word a wrong type its own way before `__post_init__` could: tests
    # then see the errors users see. (`typing.get_type_hints` returns {} for such a class; the
    # field types come from `dataclasses.fields`, real types as pd has no string annotations.)
    __no_type_check__: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            checked = self._checked(f.name, f.name, value, f.type)
            if checked is not value:
                object.__setattr__(self, f.name, checked)  # the dataclasses are frozen

    def _checked(self, name: str, key: str, value: object, tp: object) -> object:
        """`value` as field `name` stores it (floats for ints), or a FieldError at `key`."""
        if typing.get_origin(tp) is tuple and isinstance(value, tuple):
            (item_tp, _) = typing.get_args(tp)
            return tuple(
                self._checked(name, f"{key}[{i}]", item, item_tp) for i, item in enumerate(value)
            )
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        # typeguard takes True as an int (bool subclasses int), and so as a float.
        if not _is_a(value, tp) or (tp in (int, float) and isinstance(value, bool)):
            literal = typing.get_origin(tp) is Literal
            raise FieldError(key, value, _describe(tp), show_type=not literal)
        if tp is int and isinstance(value, int):
            self._check_int(name, key, value)
        if tp is float and isinstance(value, float):
            fraction = name in self.FRACTIONS
            if not (math.isfinite(value) and 0.0 <= value <= (1.0 if fraction else math.inf)):
                want = "a number in [0, 1]" if fraction else "a finite non-negative number"
                raise FieldError(key, value, want)
        return value

    def _check_int(self, name: str, key: str, value: int) -> None:
        """A FieldError at `key` unless `value` is in field `name`'s range (see the class)."""
        low, word = (0, "a non-negative") if name in self.NON_NEGATIVE else (1, "a positive")
        if value < low:
            raise FieldError(key, value, f"{word} integer")
        high, shown = (2**32 - 1, "2**32 - 1") if name in self.SEEDS else (2**31 - 1, "2**31 - 1")
        if value > high:
            raise FieldError(key, value, f"an integer in [{low}, {shown}]")


def _is_a(value: object, tp: object) -> bool:
    try:
        check_type(value, tp)
    except TypeCheckError:
        return False
    return True


_TYPE_WORDS: dict[object, str] = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
}


def _describe(tp: object) -> str:
    """What a value of type `tp` is, in words of a config file."""
    if tp in _TYPE_WORDS:
        return _TYPE_WORDS[tp]
    args = typing.get_args(tp)
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(map(repr, args))
    if typing.get_origin(tp) is tuple:
        return "a tuple"
    if args:  # a union of config classes
        return "a " + ", ".join(a.__name__ for a in args[:-1]) + f" or {args[-1].__name__}"
    return f"a {getattr(tp, '__name__', tp)}"
