"""Placement groups, scheduling strategies and label selectors."""
import pytest

import torus
from torus import exceptions as exc
from torus.util import (get_placement_group, placement_group, placement_group_table,
                        remove_placement_group)
from torus.util.scheduling_strategies import (In, NodeAffinitySchedulingStrategy,
                                              NodeLabelSchedulingStrategy, NotIn,
                                              PlacementGroupSchedulingStrategy)

from helpers import cluster_head, run_python


@torus.remote
def node_of():
    return torus.get_runtime_context().get_node_id()


@torus.remote
class Where:
    def node(self):
        return torus.get_runtime_context().get_node_id()


def test_create_ready_table_remove(torus_local):
    pg = placement_group([{"CPU": 1}, {"CPU": 1, "custom": 1}], strategy="PACK",
                         name="pytest-pg")
    assert torus.get(pg.ready(), timeout=30) == pg
    assert pg.wait(10)
    assert pg.bundle_count == 2 and pg.bundle_specs[1] == {"CPU": 1.0, "custom": 1.0}
    t = placement_group_table(pg)
    assert t["state"] == "CREATED" and t["strategy"] == "PACK" and t["name"] == "pytest-pg"
    assert len(t["bundles_to_node_id"]) == 2
    assert pg.id.hex() in placement_group_table()
    assert get_placement_group("pytest-pg") == pg
    ready, _ = torus.wait([pg.ready()], timeout=5)
    assert ready
    remove_placement_group(pg)
    with pytest.raises(Exception):
        torus.get(pg.ready(), timeout=10)
    with pytest.raises(ValueError):
        get_placement_group("pytest-pg")


def test_tasks_and_actors_in_bundles(torus_local):
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_PACK")
    torus.get(pg.ready(), timeout=30)
    node = torus.get_runtime_context().get_node_id()
    for idx in (-1, 0, 1):
        s = PlacementGroupSchedulingStrategy(placement_group=pg,
                                             placement_group_bundle_index=idx)
        assert torus.get(node_of.options(scheduling_strategy=s).remote(), timeout=60) == node
    a = Where.options(num_cpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=0)).remote()
    assert torus.get(a.node.remote(), timeout=60) == node
    with pytest.raises(ValueError):
        node_of.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=2)).remote()
    torus.kill(a)
    remove_placement_group(pg)


@torus.remote
def my_group():
    from torus.util import get_current_placement_group
    cur = get_current_placement_group()
    return torus.get_runtime_context().get_placement_group_id(), cur.id.hex() if cur else None


@torus.remote
class GroupReporter:
    def group(self):
        return torus.get_runtime_context().get_placement_group_id()


def test_runtime_context_names_the_placement_group(torus_local):
    pg = placement_group([{"CPU": 1}], strategy="PACK")
    torus.get(pg.ready(), timeout=30)
    in_pg = PlacementGroupSchedulingStrategy(placement_group=pg)
    assert torus.get(my_group.options(scheduling_strategy=in_pg).remote(), timeout=60) == (
        pg.id.hex(), pg.id.hex())
    assert torus.get(my_group.remote(), timeout=60) == (None, None)
    a = GroupReporter.options(num_cpus=0, scheduling_strategy=in_pg).remote()
    assert torus.get(a.group.remote(), timeout=60) == pg.id.hex()
    assert torus.get_runtime_context().get_placement_group_id() is None  # the driver
    torus.kill(a)
    remove_placement_group(pg)


def test_infeasible_group_stays_pending(torus_local):
    pg = placement_group([{"CPU": 64}])
    assert not pg.wait(1)
    with pytest.raises(exc.GetTimeoutError):
        torus.get(pg.ready(), timeout=0.5)
    ready, not_ready = torus.wait([pg.ready()], timeout=0.3)
    assert not ready and len(not_ready) == 1
    assert placement_group_table(pg)["state"] == "PENDING"
    remove_placement_group(pg)


def test_bad_arguments(torus_local):
    with pytest.raises(ValueError):
        placement_group([])
    with pytest.raises(ValueError):
        placement_group([{}])
    with pytest.raises(ValueError):
        placement_group([{"CPU": 1}], strategy="EVERYWHERE")
    with pytest.raises(ValueError):
        placement_group([{"CPU": 1}], bundle_label_selector=[{}, {}])


def test_label_selectors(torus_local):
    node = torus.get_runtime_context().get_node_id()
    assert torus.get(node_of.options(label_selector={"zone": "test-a"}).remote(),
                     timeout=60) == node
    assert torus.get(node_of.options(label_selector={"zone": "in(test-a,test-b)"}).remote(),
                     timeout=60) == node
    s = NodeLabelSchedulingStrategy(hard={"zone": In("test-a")})
    assert torus.get(node_of.options(scheduling_strategy=s).remote(), timeout=60) == node
    # No node matches: the task stays pending.
    ref = node_of.options(scheduling_strategy=NodeLabelSchedulingStrategy(
        hard={"zone": NotIn("test-a")})).remote()
    ready, _ = torus.wait([ref], timeout=1.5)
    assert not ready
    pg = placement_group([{"CPU": 1}], bundle_label_selector=[{"zone": "test-a"}])
    assert pg.wait(30)
    remove_placement_group(pg)
    pg = placement_group([{"CPU": 1}], bundle_label_selector=[{"zone": "nowhere"}])
    assert not pg.wait(1)
    remove_placement_group(pg)


def test_node_affinity(torus_local):
    node = torus.get_runtime_context().get_node_id()
    s = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
    assert torus.get(node_of.options(scheduling_strategy=s).remote(), timeout=60) == node
    soft = NodeAffinitySchedulingStrategy(node_id="ff" * 14, soft=True)
    assert torus.get(node_of.options(scheduling_strategy=soft).remote(), timeout=60) == node


def test_strategies_across_nodes():
    """STRICT_SPREAD over three nodes, PACK on one, bundle index pinning: a cluster of processes."""
    with cluster_head("--num-cpus", "2", "--labels", "rack=r0") as c:
        c.add_node("--num-cpus", "2", "--labels", "rack=r1")
        c.add_node("--num-cpus", "2", "--labels", "rack=r2")
        out = run_python("""
            import torus
            from torus.util import placement_group, remove_placement_group
            from torus.util.scheduling_strategies import PlacementGroupSchedulingStrategy as S
            torus.init()
            @torus.remote(num_cpus=1)
            def node():
                return torus.get_runtime_context().get_node_id()
            assert len([n for n in torus.nodes() if n["Alive"]]) == 3
            pg = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
            torus.get(pg.ready(), timeout=60)
            nodes = torus.get([node.options(scheduling_strategy=S(pg, i)).remote()
                               for i in range(3)], timeout=120)
            assert len(set(nodes)) == 3, nodes
            table = torus.util.placement_group_table(pg)
            assert [table["bundles_to_node_id"][i] for i in range(3)] == nodes, (table, nodes)
            remove_placement_group(pg)
            pg = placement_group([{"CPU": 1}] * 2, strategy="STRICT_PACK")
            torus.get(pg.ready(), timeout=60)
            nodes = torus.get([node.options(scheduling_strategy=S(pg, i)).remote()
                               for i in range(2)], timeout=120)
            assert len(set(nodes)) == 1, nodes
            remove_placement_group(pg)   # its node (2 CPUs) would have no room for the next
            impossible = placement_group([{"CPU": 1}] * 4, strategy="STRICT_SPREAD")
            assert not impossible.wait(2)
            remove_placement_group(impossible)
            r1 = torus.get(node.options(label_selector={"rack": "r1"}).remote(), timeout=60)
            assert [n["Labels"]["rack"] for n in torus.nodes() if n["NodeID"] == r1] == ["r1"]
            print("OK")
        """, env=c.driver_env(), timeout=300)
        assert "OK" in out.stdout, out.stdout + out.stderr


@torus.remote
def child_group():
    return torus.get_runtime_context().get_placement_group_id()


@torus.remote
def parent_group():
    return (torus.get(child_group.remote(), timeout=60),
            torus.get(child_group.options(scheduling_strategy="DEFAULT").remote(), timeout=60))


@torus.remote(num_cpus=0)
class Spawner:
    def spawn(self):
        return torus.get(child_group.remote(), timeout=60)


def test_capture_child_tasks(torus_local):
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="PACK")
    torus.get(pg.ready(), timeout=30)
    gid = pg.id.hex()
    capture = PlacementGroupSchedulingStrategy(placement_group=pg,
                                               placement_group_capture_child_tasks=True)
    # Children without a strategy of their own go into the parent's group; an explicit
    # strategy wins.
    assert torus.get(parent_group.options(scheduling_strategy=capture).remote(),
                     timeout=120) == (gid, None)
    # Without capture, children are scheduled as usual.
    plain = PlacementGroupSchedulingStrategy(placement_group=pg)
    assert torus.get(parent_group.options(scheduling_strategy=plain).remote(),
                     timeout=120) == (None, None)
    # An actor created with capture places the tasks its methods submit in the group too.
    a = Spawner.options(scheduling_strategy=capture).remote()
    assert torus.get(a.spawn.remote(), timeout=120) == gid
    torus.kill(a)
    remove_placement_group(pg)


def test_fractional_bundles_made_and_removed_hundreds_of_times_leave_the_node_whole():
    """Issue 41: resource amounts were doubles. After a few hundred placement groups with
    fractional CPUs, several alive at once, were created and removed, the node reported
    1.9999999999999996 CPUs and a group asking for its 2 CPUs stayed pending forever. Amounts are
    fixed point now (1/10,000 units): the node is back at exactly 2 and the group is placed."""
    with cluster_head("--num-cpus", "2") as c:
        out = run_python("""
            import torus
            from torus.util import placement_group, remove_placement_group
            torus.init()
            sizes = [0.1, 0.3, 1 / 3, 0.7, 0.2, 0.25]
            alive = []
            for i in range(300):
                pg = placement_group([{"CPU": sizes[i % len(sizes)]}])
                torus.get(pg.ready(), timeout=60)
                alive.append(pg)
                if len(alive) > 3:  # the oldest goes first, three stay
                    remove_placement_group(alive.pop(0))
            for pg in alive:
                remove_placement_group(pg)
            print("AVAILABLE", repr(torus.available_resources().get("CPU")))
            whole = placement_group([{"CPU": 2}])
            print("WHOLE", whole.wait(60))
            print("LEFT", torus.available_resources().get("CPU", 0))
        """, env=c.driver_env(), timeout=600)
        assert "AVAILABLE 2.0" in out.stdout, out.stdout + out.stderr
        assert "WHOLE True" in out.stdout, out.stdout + out.stderr
        assert "LEFT 0" in out.stdout, out.stdout + out.stderr
