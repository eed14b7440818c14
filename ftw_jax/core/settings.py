"""Settings declared once: dataclass fields that carry their help, command-line flag and sweep axis.

    @dataclasses.dataclass(frozen=True)
    class Config:
        batch_size: int = setting(8, "C, pool entries drawn per minibatch", axis="C")
        optimizer: Literal["adam", "sgd"] = setting("adam", "the Optax optimizer")

`describe(Config)` lists them (name, type, default, help, ...) for the command line, which generates its flags
from them (`ftw_jax.cli`), and for sweeps, which vary the fields marked with an `axis`. `check_settings`
validates an instance: choices, and finite numbers.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any


def setting(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    short: str | None = None,
    axis: str | None = None,
    choices: tuple | Callable[[], tuple] | None = None,
) -> Any:
    """A dataclass field with its help text; `flag` names the option when it is not the field's name
    (`--iterations` for `num_iterations`), `short` adds a one-letter one, `axis` makes it a sweep axis,
    `choices` lists the values a `str` field takes (a `Literal` annotation says it by itself), or is a function
    that lists them when asked: a registry's names, read after anything registered later."""
    metadata = {"help": help, "flag": flag, "short": short, "axis": axis, "choices": choices}
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One field of a config class, as the command line and sweeps see it."""

    name: str
    owner: type
    type: Any  # the resolved annotation
    default: Any
    help: str
    flag: str  # the command line's: "--iterations" for num_iterations
    short: str | None
    axis: str | None
    listed_choices: tuple | Callable[[], tuple] | None

    @property
    def choices(self) -> tuple | None:
        """The allowed values (of a `Literal` field, or listed by `setting`), else None."""
        if typing.get_origin(self.type) is typing.Literal:
            return typing.get_args(self.type)
        return self.listed_choices() if callable(self.listed_choices) else self.listed_choices

    @property
    def base_type(self) -> Any:
        """The type without `| None`."""
        args = [arg for arg in typing.get_args(self.type) if arg is not type(None)]
        if typing.get_origin(self.type) in (typing.Union, types.UnionType) and len(args) == 1:
            return args[0]
        return self.type


def describe(cls: type) -> list[Setting]:
    """The fields of a config dataclass declared with `setting`, in order."""
    hints = typing.get_type_hints(cls)
    return [
        Setting(
            name=field.name,
            owner=cls,
            type=hints[field.name],
            default=field.default,
            help=field.metadata["help"],
            flag="--" + (field.metadata["flag"] or field.name).replace("_", "-"),
            short=field.metadata["short"],
            axis=field.metadata["axis"],
            listed_choices=field.metadata["choices"],
        )
        for field in dataclasses.fields(cls)
        if "help" in field.metadata
    ]


def check_field_types(instance: Any) -> None:
    """Raises ValueError naming the field if a dataclass field of type int, float, bool, str or tuple holds a value
    of another type (`--env-options height=6.5` for an int); an int passes for a float."""
    check_option_types(
        type(instance), {field.name: getattr(instance, field.name) for field in dataclasses.fields(instance)}
    )


def check_option_types(cls: type, options: dict[str, Any]) -> None:
    """`check_field_types` for the values a dataclass is about to be built with, before its own checks compare
    them (`noise_sd=abc` would otherwise fail as "'>=' not supported"); names it does not declare are left to it."""
    hints = typing.get_type_hints(cls)
    for name, value in options.items():
        expected = hints.get(name)
        expected = (int, float) if expected is float else expected  # an int passes for a float
        if typing.get_origin(expected) is tuple:
            expected = tuple
        if expected in (int, float, bool, str, tuple, (int, float)) and (
            not isinstance(value, expected) or (expected is not bool and isinstance(value, bool))
        ):
            names = " or ".join(kind.__name__ for kind in (expected if isinstance(expected, tuple) else (expected,)))
            raise ValueError(f"{name} must be {names}, got {value!r}.")


def check_settings(instance: Any) -> None:
    """Raises ValueError naming the field if a setting holds a value outside its choices, or a number (or a tuple
    of numbers) that is not finite: NaN and infinity pass range checks such as `not lr > 0` and would train
    nothing."""
    for item in describe(type(instance)):
        value = getattr(instance, item.name)
        if item.choices is not None and value not in item.choices:
            raise ValueError(f"{item.name} must be one of {item.choices}, got {value!r}.")
        numbers = value if isinstance(value, tuple) else (value,)
        for number in numbers:
            if isinstance(number, (int, float)) and not isinstance(number, bool) and not math.isfinite(number):
                raise ValueError(f"{item.name} must be finite, got {value!r}.")


def check_takes_effect(instance: Any, name: str, effective: bool, needs: str) -> None:
    """Refuses a setting moved from its default where it would be ignored (`effective` False), naming what it
    needs: a run that silently dropped a flag would look like one that used it."""
    value = getattr(instance, name)
    default = next(field.default for field in dataclasses.fields(instance) if field.name == name)
    if not effective and value != default:
        raise ValueError(f"`{name}` {value!r} takes effect only with {needs}; set that too, or leave `{name}` out.")
