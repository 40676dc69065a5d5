"""How many logical CPUs each engine actor asks Ray for (pooler/ray/resources.py): plain
arithmetic on the cluster's node list, so no Ray here."""
from __future__ import annotations

import pytest

from pooler.ray.resources import TASK_CPUS, TASK_ROOM, plan_actors


def batch_plan(node_cpus, replicas, num_cpus=1.0, node_gpus=None, num_gpus=0.0):
    return plan_actors(node_cpus, node_gpus or [0.0] * len(node_cpus), replicas=replicas,
                       num_cpus=num_cpus, num_gpus=num_gpus, task_room=TASK_ROOM,
                       task_cpus=TASK_CPUS)


def test_room_to_spare_keeps_the_ask():
    plan = batch_plan([8.0], replicas=2, num_cpus=2)
    assert (plan.actor_cpus, plan.task_cpus, plan.threads) == (2, None, 2)


@pytest.mark.parametrize("cpus", [1, 2, 4, 16])
def test_replicas_equal_to_cpus_leave_room_for_the_read_tasks(cpus):
    plan = batch_plan([float(cpus)], replicas=cpus)
    assert plan.task_cpus == TASK_CPUS
    assert plan.threads == 1  # the engine still runs the thread asked for
    free = cpus - cpus * plan.actor_cpus
    assert TASK_ROOM - 1e-6 <= free < TASK_ROOM + 0.01 * cpus
    assert free >= 2 * plan.task_cpus  # a read task and a prepare task at once


def test_two_nodes_full_leave_a_task_slot():
    plan = batch_plan([2.0, 2.0], replicas=4)
    # Two actors per node still leave one task slot on each node.
    assert 2 - 2 * plan.actor_cpus >= TASK_CPUS


def test_too_many_replicas_is_refused_naming_cluster_and_ask():
    with pytest.raises(ValueError) as err:
        batch_plan([2.0], replicas=3)
    text = str(err.value)
    assert "--replicas 3 x --num-cpus-per-replica 1 asks for 3 CPUs" in text
    assert "the Ray cluster has 2 CPUs" in text and "at most 2" in text


def test_an_actor_larger_than_any_node_is_refused():
    # 4 CPUs in all, but no node holds a 3-CPU actor.
    with pytest.raises(ValueError, match=r"has 4 CPUs \(2 nodes of 2, 2\), where at most 0"):
        batch_plan([2.0, 2.0], replicas=1, num_cpus=3)


def test_gpus_are_checked():
    with pytest.raises(ValueError, match="needs 2 GPUs; the Ray cluster has 1 GPUs"):
        batch_plan([8.0], replicas=2, node_gpus=[1.0], num_gpus=1)
    plan = batch_plan([8.0], replicas=1, node_gpus=[1.0], num_gpus=1)
    assert plan.actor_gpus == 1


def test_serve_replicas_may_take_every_cpu():
    plan = plan_actors([2.0], [0.0], replicas=2, num_cpus=1, task_room=0)
    assert plan.actor_cpus == 1 and plan.task_cpus is None
    with pytest.raises(ValueError, match="asks for 3 CPUs"):
        plan_actors([2.0], [0.0], replicas=3, num_cpus=1, task_room=0)


def test_embed_dataset_keeps_a_whole_cpu_for_default_read_tasks():
    plan = plan_actors([2.0], [0.0], replicas=2, num_cpus=1, task_room=1.0)
    assert plan.actor_cpus == 0.5 and plan.task_cpus is None
    with pytest.raises(ValueError, match="too few"):
        plan_actors([1.0], [0.0], replicas=1, num_cpus=1, task_room=1.0)


@pytest.mark.parametrize("replicas,num_cpus", [(0, 1), (1, 0), (1, -1)])
def test_bad_asks(replicas, num_cpus):
    with pytest.raises(ValueError, match="--replicas|--num-cpus-per-replica"):
        batch_plan([2.0], replicas=replicas, num_cpus=num_cpus)
