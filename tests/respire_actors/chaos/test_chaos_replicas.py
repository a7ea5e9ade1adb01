"""Replicas for the failover scenarios (issue #15): a single-server primary/replica pair and
cluster replicas, in the chaos suite's servers and in the tests' cluster fixture."""

from __future__ import annotations

from pathlib import Path

from helpers.servers import start_cluster as start_test_cluster

from respire_actors.chaos.cluster import failover, key_slot, owner_of, replication_lag
from respire_actors.chaos.servers import spawn_replica, spawn_server, start_cluster


def test_a_replica_follows_its_primary_and_is_promoted(tmp_path: Path) -> None:
    primary = spawn_server(tmp_path / "primary")
    try:
        replica = spawn_replica(tmp_path / "replica", primary)
        try:
            primary.execute("SET", "k", "v")
            assert primary.execute("WAIT", 1, 5000) == 1
            assert replica.execute("GET", "k") == b"v"
            assert replication_lag(primary, replica) == 0
            replica.execute("REPLICAOF", "NO", "ONE")
            replica.execute("SET", "k", "w")  # writable once promoted
            assert primary.execute("GET", "k") == b"v"
        finally:
            replica.stop()
    finally:
        primary.stop()


def test_a_chaos_cluster_replica_takes_over_its_master_slots(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path / "cluster", 3, replicas_of=[2])
    try:
        (replica,) = cluster.replicas
        master = cluster.masters[2]
        slot = key_slot("{q}x")
        assert slot >= 2 * (16384 // 3)  # the third master's range
        master.execute("SET", "{q}x", "1")
        assert master.execute("WAIT", 1, 5000) == 1
        failover(replica, "graceful", cluster=cluster.nodes)
        assert owner_of(cluster.nodes, slot).port == replica.port
        assert replica.execute("GET", "{q}x") == b"1"
    finally:
        cluster.stop()


def test_the_test_cluster_fixture_adds_a_replica(tmp_path: Path) -> None:
    cluster = start_test_cluster(tmp_path / "cluster", 3)
    try:
        replica = cluster.add_replica(cluster.nodes[0])
        role = replica.execute("ROLE")
        assert role[0] == b"slave" and int(role[2]) == cluster.nodes[0].port  # type: ignore[index]
    finally:
        cluster.stop()
