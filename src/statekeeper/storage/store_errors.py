"""Telling a store's failures from the caller's: an unreachable object store raises its
client's own exceptions (botocore's, aiohttp's), which :func:`translated` turns into a
``StorageError`` naming what was done and where, while an exception from the caller's own
chunk iterator (:func:`guarded`) passes through unchanged."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar, cast

from statekeeper.errors import StatekeeperError, StorageError

__all__ = ["Produced", "guarded", "translated"]

_Method = TypeVar("_Method", bound=Callable[..., Any])


class Produced(Exception):
    """An exception raised by the caller's chunk iterator, carried past the translation of
    the store's own errors."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


def guarded(chunks: Iterable[bytes | memoryview]) -> Iterator[bytes | memoryview]:
    iterator = iter(chunks)
    while True:
        try:
            chunk = next(iterator)
        except StopIteration:
            return
        except Exception as exc:
            raise Produced(exc) from exc
        yield chunk


def translated(doing: str) -> Callable[[_Method], _Method]:
    """A method whose failures reaching the store are ``StorageError`` naming what was done
    and where: an unreachable store raises its client's own exceptions (botocore's, aiohttp's),
    which callers could not tell from a bug. A missing file stays ``FileNotFoundError``."""

    def wrap(method: _Method) -> _Method:
        @functools.wraps(method)
        def inner(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except Produced as exc:  # the caller's chunks failed, not the store
                raise exc.original from exc.original.__cause__
            except (StatekeeperError, FileNotFoundError, NotImplementedError):
                raise
            except Exception as exc:
                where = self.where(*args)
                raise StorageError(
                    getattr(exc, "errno", None),
                    f"{doing} {where} failed: {type(exc).__name__}: {exc}",
                ) from exc

        return cast(_Method, inner)

    return wrap
