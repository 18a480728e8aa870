"""Typed config -> ms-swift argv, for `swift rlhf --rlhf_type gkd` and (argument level) `megatron rlhf --rlhf_type gkd`.

Configs are composed for real (``gkd_harness.harness.launcher.compose.point_config``); the process layout is a
``gkd_harness.harness.launcher.node.NodeLayout`` from ``node_layout``, as ``gkd_harness.harness.launcher.plan`` builds it. That every flag is
accepted by ms-swift's own argument parser is ``tests/harness/launcher/test_argv_contract.py``.
"""

import dataclasses
import re
from pathlib import Path

from gkd_harness.harness.launcher.compose import point_config
from gkd_harness.harness.launcher.node import NodeLayout, node_layout
from gkd_harness.harness.launcher.swift_argv import (
    PLUGIN_PATH,
    ResolvedInputs,
    build_argv,
    hf_argv,
    megatron_argv,
    megatron_batch_sizes,
)

INPUTS = ResolvedInputs(student="/m/student", teacher="/m/teacher", dataset="/d/train.jsonl")
ONE_GPU = NodeLayout(nproc_per_node=1, nnodes=1, node_rank=0, master_addr="127.0.0.1", master_port=29511, torchrun=True)


def cfg_with(*overrides):
    return point_config(list(overrides), run_dir="/tmp/unused")[0]


def as_dict(argv):
    """``--key value`` pairs (a flag followed by several values keeps the list)."""
    out, key = {}, None
    for tok in argv[2:]:
        if tok.startswith("--"):
            key = tok[2:]
            out[key] = []
        else:
            out[key].append(tok)
    return {k: v[0] if len(v) == 1 else v for k, v in out.items()}


def hf_fields():
    from swift.arguments import RLHFArguments

    return {f.name for f in dataclasses.fields(RLHFArguments)}


def megatron_fields():
    """Field names of ms-swift's Megatron argument classes, read from source (importing them needs Transformer
    Engine; the contract test parses with the real class)."""
    import swift

    root = Path(swift.__file__).parent / "megatron" / "arguments"
    names = set()
    for path in root.glob("*.py"):
        names |= set(re.findall(r"^    (\w+): ", path.read_text(), flags=re.M))
    return names | hf_fields()


def test_hf_argv_maps_every_design_key():
    cfg = cfg_with(
        "gkd.beta=0.25",
        "gkd.temperature=0.7",
        "gkd.topk=16",
        "gkd.sft_alpha=0.3",
        "run.seed=7",
        "run.max_steps=11",
        "run.grad_accum=3",
        "run.per_device_batch_size=4",
    )
    argv = hf_argv(cfg, INPUTS, "/runs/r1", device="cpu", wandb_mode="offline", run_name="r1")
    assert argv[:4] == ["swift", "rlhf", "--rlhf_type", "gkd"]
    a = as_dict(argv)
    assert a["model"] == "/m/student" and a["teacher_model"] == "/m/teacher" and a["dataset"] == "/d/train.jsonl"
    assert a["model_type"] == a["teacher_model_type"] == "qwen3" and a["template"] == "qwen3_nothinking"
    assert a["check_model"] == "false" and a["torch_dtype"] == "float32"
    assert (a["beta"], a["temperature"], a["gkd_logits_topk"], a["sft_alpha"]) == ("0.25", "0.7", "16", "0.3")
    assert (a["seed"], a["data_seed"], a["max_steps"]) == ("7", "7", "11")
    assert (a["gradient_accumulation_steps"], a["per_device_train_batch_size"]) == ("3", "4")
    assert a["use_vllm"] == "false" and a["lmbda"] == "0.0"
    assert (
        a["external_plugins"] == PLUGIN_PATH and Path(PLUGIN_PATH).name == "plugin.py" and Path(PLUGIN_PATH).is_file()
    )
    assert a["callbacks"] == "gkd_harness" and a["report_to"] == "wandb" and a["run_name"] == "r1"
    assert a["output_dir"] == "/runs/r1/swift" and a["add_version"] == "false"
    assert a["use_cpu"] == "true"  # gloo DDP across ranks on CPU
    assert a["logging_nan_inf_filter"] == "false"  # a NaN step is logged as NaN, not 0.0
    unknown = set(a) - hf_fields()
    assert not unknown, f"not ms-swift RLHFArguments fields: {unknown}"


def test_hf_argv_variants():
    a = as_dict(hf_argv(cfg_with("tracking=disabled"), INPUTS, "/r", device="cuda", wandb_mode="disabled"))
    assert a["report_to"] == "none" and "use_cpu" not in a and "gkd_logits_topk" not in a
    a = as_dict(
        hf_argv(
            cfg_with("backend.deepspeed=zero3", "run.extra_args=[--warmup_ratio,0.1]"),
            INPUTS,
            "/r",
            device="cuda",
            wandb_mode="disabled",
        )
    )
    assert a["deepspeed"] == "zero3" and a["warmup_ratio"] == "0.1" and a["report_to"] == "none"
    a = as_dict(hf_argv(cfg_with("rollout=hf", "gkd.lmbda=0.5"), INPUTS, "/r", device="cpu", wandb_mode="offline"))
    assert a["lmbda"] == "0.5" and a["use_vllm"] == "false"


def test_megatron_argv_parallel_sizes():
    cfg = cfg_with(
        "backend=megatron",
        "backend.tensor_model_parallel_size=2",
        "backend.pipeline_model_parallel_size=2",
        "backend.context_parallel_size=2",
        "backend.sequence_parallel=true",
        "backend.nproc_per_node=8",
        "backend.nnodes=2",
        "backend.micro_batch_size=2",
        "run.grad_accum=4",
        "gkd.topk=64",
        "run.max_steps=100",
        "backend.recompute_granularity=full",
        "model.student_dtype=null",
        "model.teacher_dtype=null",
    )
    layout = node_layout(cfg.backend, {"MASTER_PORT": "29511"}, force_torchrun=True)
    assert (layout.nproc_per_node, layout.nnodes, layout.world_size) == (8, 2, 16)
    argv = build_argv(cfg, INPUTS, "/runs/m", layout, device="cuda", wandb_mode="online", run_name="m1")
    assert argv[:4] == ["megatron", "rlhf", "--rlhf_type", "gkd"]
    a = as_dict(argv)
    assert (a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"], a["context_parallel_size"]) == (
        "2",
        "2",
        "2",
    )
    assert a["sequence_parallel"] == "true" and a["micro_batch_size"] == "2"
    assert a["global_batch_size"] == str(2 * (16 // 8) * 4)  # mbs * DP (16 ranks / TP*PP*CP) * grad_accum
    assert megatron_batch_sizes(cfg.backend, layout, cfg.run.grad_accum) == (2, 16)
    assert a["train_iters"] == "100" and a["gkd_logits_topk"] == "64" and a["bf16"] == "true"
    assert a["external_plugins"] == PLUGIN_PATH and a["callbacks"] == "gkd_harness"
    assert a["wandb_project"] == "gkd-harness" and a["wandb_exp_name"] == "m1"
    assert a["recompute_granularity"] == "full" and "use_cpu" not in a
    unknown = set(a) - megatron_fields()
    assert not unknown, f"not ms-swift Megatron argument fields: {unknown}"


def test_megatron_global_batch_follows_the_layout_not_the_config_alone():
    """The same config on 1 and 2 nodes of 8: DP 8 -> 16, so the derived global batch doubles (issue: a node's
    own argv once said 8 where the job had 16 data-parallel ranks)."""
    cfg = cfg_with("experiment=seed", "run.dataset=x/y")
    sizes = []
    for nodes in (1, 2):
        layout = NodeLayout(
            nproc_per_node=8, nnodes=nodes, node_rank=0, master_addr="n1", master_port=29511, torchrun=True
        )
        sizes.append(as_dict(megatron_argv(cfg, INPUTS, "/r", layout, wandb_mode="offline"))["global_batch_size"])
    assert sizes == ["8", "16"]
    fixed = cfg_with("experiment=seed", "run.dataset=x/y", "backend.global_batch_size=64")
    assert as_dict(megatron_argv(fixed, INPUTS, "/r", ONE_GPU, wandb_mode="offline"))["global_batch_size"] == "64"


def test_megatron_colocated_rollout_args():
    cfg = cfg_with(
        "backend=megatron",
        "rollout=vllm_colocate",
        "gkd.lmbda=0.5",
        "backend.nproc_per_node=8",
        "rollout.vllm.device=cuda",
        "model.student_dtype=null",
        "model.teacher_dtype=null",
    )
    a = as_dict(megatron_argv(cfg, INPUTS, "/runs/m", ONE_GPU, wandb_mode="disabled"))
    assert a["use_vllm"] == "true" and a["vllm_mode"] == "colocate" and a["lmbda"] == "0.5"
    assert a["report_to"] == "none" and "wandb_project" not in a
    assert set(a) - megatron_fields() == set()


def test_checkpoints_only_when_asked():
    argv = hf_argv(cfg_with(), INPUTS, "/r", device="cpu", wandb_mode="offline")
    assert as_dict(argv)["save_strategy"] == "no"
    a = as_dict(hf_argv(cfg_with("run.save_steps=5"), INPUTS, "/r", device="cpu", wandb_mode="offline"))
    assert (a["save_strategy"], a["save_steps"], a["save_only_model"]) == ("steps", "5", "false")
