"""The collector settings of the long-running processes (:mod:`airuntime.core.gc_tuning`).

``tune_collector`` changes the garbage collector of the whole process, so it is run in a
child interpreter, never in the test runner's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from airuntime.core.gc_tuning import (
    DEFAULT_GEN0_THRESHOLD,
    GC_GEN0_THRESHOLD_ENV,
    MAX_GEN0_THRESHOLD,
    gen0_threshold_from_env,
)

CHILD = textwrap.dedent(
    """
    import gc, json, sys, weakref
    from airuntime.core.gc_tuning import tune_collector

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    gc.disable()  # only the calls below collect: nothing is left to chance
    before = cycle()  # garbage already, when the collector is tuned
    threshold_before = gc.get_threshold()
    changed = tune_collector(int(sys.argv[1]))
    after = cycle()  # garbage made after the freeze
    frozen = gc.get_freeze_count()
    gc.collect()
    print(json.dumps({
        "changed": changed,
        "threshold_before": threshold_before,
        "threshold": gc.get_threshold(),
        "frozen": frozen,
        "before_collected": before() is None,
        "after_collected": after() is None,
    }))
    """
)


def _child(threshold: int) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(threshold)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_tuning_freezes_the_live_heap_collects_first_and_raises_the_young_threshold() -> None:
    tuned = _child(5000)
    assert tuned["changed"] is True
    assert tuned["threshold"] == [5000, *tuned["threshold_before"][1:]]  # type: ignore[index]
    assert tuned["frozen"] > 1_000  # type: ignore[operator]  # imports: never scanned again
    # Garbage from before the freeze was collected, not frozen; cycles made after it are
    # still collected.
    assert tuned["before_collected"] is True
    assert tuned["after_collected"] is True


def test_zero_leaves_pythons_collector_as_it_is() -> None:
    untouched = _child(0)
    assert untouched["changed"] is False
    assert untouched["threshold"] == untouched["threshold_before"]
    assert untouched["frozen"] == 0
    assert untouched["before_collected"] is True


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, DEFAULT_GEN0_THRESHOLD), ("", DEFAULT_GEN0_THRESHOLD), (" 0 ", 0), ("20000", 20000)],
)
def test_the_threshold_comes_from_the_environment(value: str | None, expected: int) -> None:
    environ = {} if value is None else {GC_GEN0_THRESHOLD_ENV: value}
    assert gen0_threshold_from_env(environ) == expected


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", str(MAX_GEN0_THRESHOLD + 1)])
def test_a_malformed_threshold_is_refused_naming_the_variable_and_value(value: str) -> None:
    with pytest.raises(ValueError) as refused:
        gen0_threshold_from_env({GC_GEN0_THRESHOLD_ENV: value})
    assert GC_GEN0_THRESHOLD_ENV in str(refused.value)
    assert repr(value) in str(refused.value)


PAUSED_CHILD = textwrap.dedent(
    """
    import gc, json, threading, weakref
    from airuntime.core.gc_tuning import collector_paused

    class Node:
        pass

    seen = {}
    with collector_paused():
        seen["inside"] = gc.isenabled()
        a, b = Node(), Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        del a, b
        seen["cycle_kept_while_paused"] = ref() is not None
    seen["after"] = gc.isenabled()
    gc.collect()
    seen["cycle_collected_after"] = ref() is None

    try:
        with collector_paused():
            raise KeyError("boom")
    except KeyError:
        pass
    seen["after_raise"] = gc.isenabled()

    gc.disable()
    with collector_paused():
        pass
    seen["stays_off"] = not gc.isenabled()
    gc.enable()

    # Two threads' blocks overlapping: on again once both have ended.
    inside = threading.Barrier(2)
    leave = threading.Barrier(2)
    def block():
        with collector_paused():
            inside.wait(10)
            leave.wait(10)
    threads = [threading.Thread(target=block) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    seen["after_threads"] = gc.isenabled()
    print(json.dumps(seen))
    """
)


def test_a_paused_collector_is_off_in_the_block_and_as_it_was_after() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PAUSED_CHILD], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == {
        "inside": False,
        "cycle_kept_while_paused": True,
        "after": True,
        "cycle_collected_after": True,
        "after_raise": True,
        "stays_off": True,
        "after_threads": True,
    }
