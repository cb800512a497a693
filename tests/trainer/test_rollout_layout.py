"""Where separate rollout engines go: KubeRay pools, spare local GPUs, or a share of the trainer's GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kuberl.api import parse_spec
from kuberl.api.contract import POOL_LABEL
from kuberl.trainer.plan.execution import plan_execution
from kuberl.trainer.plan.layout import ClusterFacts, PlacementError, engine_actor_options, rollout_pool_labelled

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "separate-rollout.yaml"


def spec(trainer_gpus: int = 16, rollout_gpus: int = 8, tp: int = 2):
    document = yaml.safe_load(EXAMPLE.read_text())
    cluster = document["spec"]["cluster"]
    cluster["trainer"].update(nodes=1, gpusPerNode=trainer_gpus)
    cluster["rollout"].update(nodes=1, gpusPerNode=rollout_gpus)
    document["spec"]["rollout"]["tensorParallelSize"] = tp
    return parse_spec(document["spec"])


def layout_of(spec, cluster: ClusterFacts):
    return plan_execution(spec, cluster).rollout


def test_the_rollout_pool_is_recognised_by_the_node_label_the_operator_sets():
    from kuberl.operator.rayjob import render_rayjob

    groups = render_rayjob("job", "ns", "uid", spec())["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    nodes = [{"Alive": True, "Labels": g["labels"]} for g in groups]
    assert rollout_pool_labelled(nodes)
    assert not rollout_pool_labelled(nodes[:1])
    assert not rollout_pool_labelled([{**nodes[1], "Alive": False}])


def test_on_kuberay_the_pools_are_selected_by_their_node_label_and_weights_go_over_nccl():
    layout = layout_of(spec(), ClusterFacts(gpus=0, rollout_pool_labelled=True))
    assert (layout.kind, layout.engines, layout.gpus_per_engine, layout.transport) == ("pools", 4, 2, "nccl")
    assert layout.trainer_label_selector == {POOL_LABEL: "trainer"}
    assert engine_actor_options(layout, 0, trainer_placement_group=None, share=0.2) == {
        "num_cpus": 1,
        "num_gpus": 2,
        "label_selector": {POOL_LABEL: "rollout"},
    }


def test_locally_with_enough_gpus_the_engines_take_gpus_of_their_own():
    layout = layout_of(spec(trainer_gpus=4, rollout_gpus=4), ClusterFacts(gpus=8, rollout_pool_labelled=False))
    assert (layout.kind, layout.engines, layout.transport) == ("disjoint", 2, "nccl")
    assert layout.trainer_label_selector is None
    assert engine_actor_options(layout, 1, trainer_placement_group=None, share=0.2) == {"num_cpus": 1, "num_gpus": 2}


@pytest.mark.parametrize(("labelled", "kind"), [(False, "disjoint"), (True, "pools")])
def test_cpu_engines_take_no_gpus_and_get_weights_through_the_object_store(labelled, kind):
    document = yaml.safe_load(EXAMPLE.read_text())["spec"]
    document["cluster"].update(
        device="cpu", trainer={"nodes": 1, "gpusPerNode": 2}, rollout={"nodes": 1, "gpusPerNode": 3}
    )
    document["rollout"].update(engine="hf", tensorParallelSize=1)
    layout = layout_of(parse_spec(document), ClusterFacts(gpus=0, rollout_pool_labelled=labelled))
    assert (layout.kind, layout.engines, layout.gpus_per_engine, layout.transport) == (kind, 3, 0, "object_store")
    assert engine_actor_options(layout, 2, trainer_placement_group=None, share=0.2)["num_gpus"] == 0


def test_on_one_gpu_the_engine_shares_the_trainer_bundle_and_weights_go_by_cuda_ipc(local_ray):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    layout = layout_of(spec(trainer_gpus=1, rollout_gpus=1, tp=1), ClusterFacts(gpus=1, rollout_pool_labelled=False))
    assert (layout.kind, layout.engines, layout.transport) == ("shared", 1, "ipc")
    pg = placement_group([{"CPU": 1.0}])
    ray.get(pg.ready())
    try:
        options = engine_actor_options(layout, 0, trainer_placement_group=pg, share=0.2)
        assert (options["num_cpus"], options["num_gpus"]) == (0.2, 0.2)
        assert options["scheduling_strategy"].placement_group_bundle_index == 0
    finally:
        remove_placement_group(pg)


@pytest.mark.parametrize(
    "trainer_gpus, rollout_gpus, tp, cluster_gpus",
    [
        (1, 2, 1, 1),  # two engines, one trainer GPU to share
        (2, 2, 2, 2),  # tensor parallel engines cannot share
    ],
)
def test_a_layout_that_does_not_fit_names_the_fields(trainer_gpus, rollout_gpus, tp, cluster_gpus):
    with pytest.raises(PlacementError, match=r"cluster\.rollout: .* rollout\.tensorParallelSize"):
        layout_of(spec(trainer_gpus, rollout_gpus, tp), ClusterFacts(gpus=cluster_gpus, rollout_pool_labelled=False))


def test_a_gpu_job_on_a_machine_without_enough_gpus_fails_at_once(local_ray):
    import ray

    from kuberl.trainer.driver.cluster import Cluster

    gpus = int(ray.cluster_resources().get("GPU", 0))
    cluster = Cluster(spec(trainer_gpus=gpus + 1, rollout_gpus=1, tp=1), address=None, write=print)
    expected = rf"cluster.trainer asks for {gpus + 1} GPU\(s\) and this machine has {gpus}"
    with pytest.raises(PlacementError, match=expected):
        cluster.facts()
