"""Run calls from two threads at once, to check that per-call decoding state is not shared."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def run_in_two_threads(call: Callable[[int], T], repeats: int = 2) -> list[list[T]]:
    """``call(i)`` ``repeats`` times in thread ``i`` (i = 0, 1), both threads started together; per thread the
    results in order. A thread's exception is raised here (it would otherwise vanish with the thread)."""
    results: list[list[T]] = [[], []]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(i: int) -> None:
        try:
            barrier.wait()
            for _ in range(repeats):
                results[i].append(call(i))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
