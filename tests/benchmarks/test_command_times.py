"""The benchmarks' per-script server time (:mod:`benchmarks.command_times`) on a real
Valkey: every command of the block counted by name, scripts by their library name, an
overflowing log reported as incomplete, the server's settings put back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from airuntime.core.keys import ExecutionKeys
from airuntime.core.scripts import library
from benchmarks.command_times import CommandTimes


@pytest.fixture
def client(valkey_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(valkey_url)
    try:
        yield c
    finally:
        c.close()


def _settings(c: redis.Redis) -> tuple[str, str]:
    got = {**c.config_get("slowlog-log-slower-than"), **c.config_get("slowlog-max-len")}
    return got["slowlog-log-slower-than"], got["slowlog-max-len"]


def test_every_command_and_script_call_is_counted_by_name(client: redis.Redis) -> None:
    script = library()["claimSteps"]
    client.script_load(script.source)
    keys = ExecutionKeys("ex-missing").for_script(script.num_keys)
    with CommandTimes(client, capacity=100) as times:
        for i in range(5):
            client.set(f"k{i}", "v")
            client.get(f"k{i}")
            client.get(f"k{i}")
            # on an execution that does not exist: {-1}, after one EXISTS
            assert client.evalsha(script.sha, len(keys), *keys, "w", 1, 1000, 1) == [-1]
    assert times.complete
    rows = {r.name: r for r in times.per(5)}
    assert {n: r.calls_per_unit for n, r in rows.items()} == {
        "SET": 1.0,
        "GET": 2.0,
        "EVALSHA claimSteps": 1.0,
        "EXISTS": 1.0,  # the command the script ran is logged too
    }
    evalsha = rows["EVALSHA claimSteps"]
    assert evalsha.us_per_unit == pytest.approx(evalsha.us_per_call, abs=0.1)
    assert all(r.us_per_call >= 0 for r in rows.values())


def test_a_log_too_small_for_the_block_is_reported_incomplete(client: redis.Redis) -> None:
    with CommandTimes(client, capacity=3) as times:
        for i in range(10):
            client.set(f"k{i}", "v")
    assert not times.complete
    assert [e["command"] for e in times.entries] == [
        f"SET k{i} v".encode() for i in range(9, 4, -1)
    ]


def test_the_servers_settings_are_put_back(client: redis.Redis) -> None:
    before = _settings(client)
    with pytest.raises(RuntimeError), CommandTimes(client, capacity=50):
        client.set("k", "v")
        raise RuntimeError("the workload failed")
    assert _settings(client) == before
    with CommandTimes(client, capacity=50):
        client.set("k", "v")
    assert _settings(client) == before
    assert client.slowlog_len() == 0
