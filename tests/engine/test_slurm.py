"""lab.engine.slurm's parsers and routing, on `scontrol` output captured from the two-node cluster
bin/setup-slurm starts (tests/data/slurm/README.md)."""

from __future__ import annotations

import pytest

from lab.core.arch import Arch
from lab.engine.engines import EngineFacts, parse_spec
from lab.engine.routing import routes
from lab.engine.slurm import (
    expand_hostlist,
    gpu_count,
    parse_records,
    parse_squeue,
    partitions_from,
)
from tests.conftest import DATA

SLURM = DATA / "slurm"


def captured():
    return partitions_from((SLURM / "partitions.txt").read_text(), (SLURM / "nodes.txt").read_text())


def test_partitions_and_their_nodes_from_scontrol():
    found = {p.name: p for p in captured()}
    assert set(found) == {"lab", "lab-arm64"}
    lab, arm = found["lab"], found["lab-arm64"]
    assert lab.default and not arm.default and lab.up and arm.up
    assert [n.name for n in lab.nodes] == ["vm"] and [n.name for n in arm.nodes] == ["vm-2"]
    assert (lab.arch, arm.arch) == ("amd64", "arm64")  # declared features win over slurmd's Arch=x86_64
    assert lab.cpus == 2 and lab.memory == 23593 * 1024 * 1024 and lab.gpus == 0


def test_records_keep_values_with_spaces():
    [record] = parse_records("NodeName=n1 Arch=aarch64 OS=Linux 6.1.0 #1 SMP Reason=Not responding [slurm@t] "
                             "Gres=gpu:h100:4(S:0-1) RealMemory=1000 CPUTot=72 AvailableFeatures=(null)")
    assert record["OS"] == "Linux 6.1.0 #1 SMP" and record["Reason"] == "Not responding [slurm@t]"
    assert gpu_count(record["Gres"]) == 4


def test_a_gpu_partition_of_aarch64_nodes():
    nodes = ("NodeName=gh[01-02] Arch=aarch64 CPUTot=72 AvailableFeatures=(null) Gres=gpu:gh200:1 "
             "RealMemory=491520 State=IDLE")
    text = "\n".join(nodes.replace("gh[01-02]", f"gh0{i}") for i in (1, 2))
    [p] = partitions_from("PartitionName=gh Nodes=gh[01-02] State=UP Default=NO", text)
    assert (p.arch, p.cpus, p.gpus, len(p.nodes)) == ("arm64", 72, 1, 2)


def test_hostlists_and_gres():
    assert expand_hostlist("a,b[1-3,5],c-[08-10]") == ["a", "b1", "b2", "b3", "b5", "c-08", "c-09", "c-10"]
    assert gpu_count("(null)") == 0 and gpu_count("gpu:8,shard:2") == 8 and gpu_count("gpu:a100:2(S:0)") == 2


def test_squeue_of_an_array():
    states = parse_squeue("12_[2-3]|PENDING|(null)|Resources\n12_0|RUNNING|vm|None\n12_1|NODE_FAIL|vm-2|None\n")
    assert {i: s.state for i, s in states.items()} == {0: "RUNNING", 1: "NODE_FAIL"}
    assert states[1].node == "vm-2"


def test_slurm_spec_and_routing_by_arch():
    spec = parse_spec("slurm:gh", "--engine")
    assert (spec.kind, spec.name) == ("slurm", "slurm:gh") and parse_spec("slurm:", "config").problem
    facts = [EngineFacts(f"slurm:{p.name}", f"slurm:{p.name}", "config", reachable=True, arch=p.arch, cpus=p.cpus,
                         memory=p.memory, gpu=p.gpus > 0, emulates=(), kind="slurm", nodes=len(p.nodes))
             for p in captured()]
    assert [r.engine for r in routes("arm64", False, facts)] == ["slurm:lab-arm64"]
    assert [r.engine for r in routes("amd64", False, facts)] == ["slurm:lab"]


def test_a_partition_whose_nodes_run_docker_takes_the_other_arch_emulated(monkeypatch):
    """LAB_SLURM_NODE_ENGINE=docker declares Docker with QEMU on the nodes: the amd64 partition then also
    takes an arm64 case, after the native arm64 partition and marked emulated; with the local engine
    (or `auto`, which cannot know from here) it takes its own arch only."""
    from lab.engine.engines import describe_slurm
    from lab.engine.slurm import SlurmEngine, SlurmError
    monkeypatch.setattr(SlurmEngine, "version", property(lambda self: "slurm-wlm 22.05.8"))
    found = {p.name: p for p in captured()}

    def facts(node_engine):
        out = []
        for name in ("lab-arm64", "lab"):
            engine = SlurmEngine(name, node_engine=node_engine)
            engine._facts = found[name]
            out.append(describe_slurm(parse_spec(f"slurm:{name}", "config"), engine))
        return out

    docker = facts("docker")
    assert docker[1].emulates == ("arm64",) and "Docker engine on its node" in docker[1].confinement
    assert [(r.engine, r.emulated) for r in routes("arm64", False, docker)] == [("slurm:lab-arm64", False),
                                                                               ("slurm:lab", True)]
    for node_engine in ("local", "auto"):
        assert [r.engine for r in routes("arm64", False, facts(node_engine))] == ["slurm:lab-arm64"]
    engine = SlurmEngine("lab", node_engine="local")
    engine._facts = found["lab"]
    with pytest.raises(SlurmError, match="has no arm64 nodes"):
        engine.check_native(Arch.ARM64, "a case")
