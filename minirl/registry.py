"""One small name -> object registry, used for tools, reward terms, losses, advantage
estimators and rollout engines.

    LOSSES = Registry("loss")

    @LOSSES.register("cispo")
    def cispo_loss(...): ...

    LOSSES.get("cispoo")  # ConfigError: unknown loss 'cispoo'; known: cispo, grpo
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from minirl.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects; unknown names fail with the list of known ones."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(f"unknown {self.kind} '{name}'; known: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
