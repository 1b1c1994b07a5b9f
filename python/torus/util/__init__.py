"""`torus.util` (Ray's `ray.util`): placement groups, scheduling strategies, TPU slices."""
from torus.util import scheduling_strategies  # noqa: F401
from torus.util.placement_group import (PlacementGroup, get_current_placement_group,  # noqa: F401
                                        get_placement_group, placement_group,
                                        placement_group_table, remove_placement_group)


def get_node_ip_address() -> str:
    from torus.exceptions import _node_ip
    return _node_ip()


def list_named_actors(all_namespaces: bool = False):
    raise NotImplementedError("torus.util.list_named_actors is not implemented by Torus")


def __getattr__(name):
    # ray.util.tpu is imported on first use (it is large and most programs never touch it).
    if name == "tpu":
        import importlib
        return importlib.import_module("torus.util.tpu")
    if name == "ActorPool":
        from torus.util.actor_pool import ActorPool
        return ActorPool
    raise AttributeError(f"module 'torus.util' has no attribute '{name}' (not implemented by "
                         f"Torus)")


__all__ = ["PlacementGroup", "placement_group", "remove_placement_group", "get_placement_group",
           "placement_group_table", "get_current_placement_group", "get_node_ip_address",
           "scheduling_strategies"]
