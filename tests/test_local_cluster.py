"""The local cluster the cluster tests stand on: its topology, its URL, and stopping a
node."""

from __future__ import annotations

import pytest
import redis

from airuntime.devstack.cluster import SLOTS, LocalCluster


def test_the_session_cluster_has_three_masters_each_with_a_synced_replica(
    valkey_cluster: LocalCluster,
) -> None:
    masters, replicas = valkey_cluster.masters(), valkey_cluster.replica_ports()
    assert len(masters) == 3 and len(replicas) == 3 and not set(masters) & set(replicas)
    assert valkey_cluster.url == "redis+cluster://" + ",".join(
        f"127.0.0.1:{p}" for p in valkey_cluster.ports
    )
    for port in replicas:
        with redis.Redis(port=port, decode_responses=True) as node:
            assert node.info("replication")["master_link_status"] == "up"
    with redis.Redis(port=masters[0], decode_responses=True) as node:
        info = str(node.execute_command("CLUSTER", "INFO"))
        assert f"cluster_slots_ok:{SLOTS}" in info.split()


def test_a_stopped_master_without_replica_leaves_the_cluster_down() -> None:
    with LocalCluster(shards=3, replicas=0) as cluster:
        victim = cluster.masters()[0]
        cluster.stop_node(victim)
        assert victim not in cluster.masters()
        with pytest.raises(Exception, match="not healthy"):
            cluster.wait_healthy(timeout=2)


@pytest.mark.parametrize(("shards", "replicas"), [(0, 0), (2, 1), (3, -1)])
def test_impossible_shapes_are_refused(shards: int, replicas: int) -> None:
    with pytest.raises(ValueError, match="shard"):
        LocalCluster(shards=shards, replicas=replicas)
