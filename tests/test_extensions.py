"""The installers that register higher layers with the core: run once, completely, before
any thread consults a table."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from statekeeper import extensions


@pytest.fixture
def fresh() -> Iterator[list[str]]:
    extensions.install()  # the package's own installers first
    calls: list[str] = []
    yield calls
    extensions._pending.clear()


def test_a_thread_arriving_during_an_install_waits_for_it(fresh: list[str]) -> None:
    started, release = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(30)
        fresh.append("slow")

    extensions.add_installer(slow)
    first = threading.Thread(target=extensions.install)
    first.start()
    assert started.wait(30)
    seen: list[list[str]] = []
    # (typing) a lambda running two calls in the thread
    second = threading.Thread(target=lambda: (extensions.install(), seen.append(list(fresh))))  # type: ignore[func-returns-value]
    second.start()
    release.set()
    first.join(30)
    second.join(30)
    assert seen == [["slow"]]  # the second caller returned only after the installer ran


def test_a_failed_installer_runs_again_and_reentry_returns(fresh: list[str]) -> None:
    attempts = iter([True, False])

    def flaky() -> None:
        extensions.install()  # re-entered from an installer: returns, no recursion
        if next(attempts):
            raise RuntimeError("not yet")
        fresh.append("flaky")

    extensions.add_installer(flaky)
    with pytest.raises(RuntimeError, match="not yet"):
        extensions.install()
    extensions.install()
    assert fresh == ["flaky"]
    extensions.install()
    assert fresh == ["flaky"]  # once
