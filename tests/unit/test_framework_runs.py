"""doctor's analysis of run directories recorded under real frameworks (transformers 5.25.0 with
accelerate 1.16.0, lightning 2.6.6, torch 2.13.0+cpu; tests/data/framework_runs/README.md): the
framework is named, the fixes say its settings, and Lightning's closure (the forward and backward
it runs inside ``optimizer.step``) is not the optimizer's cost. They read the recordings: CI,
which installs none of the frameworks, keeps checking the wording."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from doctor.pipeline import analyze_run
from tests.support import ROOT

RUNS = ROOT / "tests" / "data" / "framework_runs"


def verdict_of(name: str, tmp_path: Path) -> dict[str, Any]:
    copy = tmp_path / name
    shutil.copytree(RUNS / name, copy)  # the analysis may write beside the run
    return analyze_run(copy).verdict.to_dict()


def finding(verdict: dict[str, Any], finding_id: str) -> dict[str, Any]:
    return next(f for f in verdict["findings"] if f["id"] == finding_id)


def test_the_trainers_loader_fix_is_in_training_arguments(tmp_path: Path) -> None:
    verdict = verdict_of("hf_trainer", tmp_path)
    assert verdict["job"]["framework"] == "Hugging Face Trainer 5.25.0"
    fix = finding(verdict, "input.loader")["fixes"][0]
    assert "args = TrainingArguments(..., dataloader_num_workers=" in fix["code"]
    assert "TrainingArguments(dataloader_num_workers=" in fix["why"]
    # its loader batches through a batch sampler (the loader's own batch_size is None)
    assert "batch_size=16" in fix["code"] and "batch_size=None" not in fix["code"]
    codes = "\n".join(x["code"] for f in verdict["findings"] for x in f["fixes"])
    assert "TrainingArguments(..., bf16=True)" in codes  # the fp32 GEMMs' fix
    for gpu_only in ("non_blocking", "device='cuda'", "pin_memory=True", ".cuda("):
        assert gpu_only not in codes  # a CPU job


def test_lightnings_closure_is_not_the_optimizers_cost(tmp_path: Path) -> None:
    verdict = verdict_of("lightning", tmp_path)
    assert verdict["job"]["framework"] == "PyTorch Lightning 2.6.6"
    unfused = finding(verdict, "optimizer.unfused")
    # 94 % before the closure was timed apart: the step's forward and backward with it
    assert 0.15 <= unfused["evidence"]["optimizer_share"] <= 0.6
    fused = unfused["fixes"][0]
    assert "def configure_optimizers(self):" in fused["code"]
    assert "torch.optim.Adam(self.parameters(), lr=self.lr, fused=True)" in fused["code"]
    assert fused["apply"] == {"optimizer": {"fused": True}}



def test_a_deepspeed_zero3_job_gets_deepspeeds_keys_never_ddp_fsdp_or_batchnorm(
        tmp_path: Path) -> None:
    verdict = verdict_of("deepspeed_zero3", tmp_path)
    job = verdict["job"]
    assert job["framework"] == "DeepSpeed 0.19.8"
    assert job["parallelism"].startswith("DeepSpeed ZeRO-3 over 2 ranks (overlap_comm=True, ")
    assert "stage3_param_persistence_threshold=1e+05" in job["parallelism"]
    assert job["parallel_kinds"] == ["sharded"]  # no DDP, no batch statistics
    assert verdict["bottleneck"] == "communication"
    exposed = finding(verdict, "comm.exposed")
    assert exposed["evidence"]["exposed_by_role"] == {"sharded": 1.0}
    words = "\n".join(x["title"] + x["why"] + x["code"] for x in exposed["fixes"])
    for foreign in ("bucket_cap", "no_sync", "compress_hook", "fully_shard", "set_modules_to",
                    "BatchNorm", "GroupNorm"):
        assert foreign not in words
    titles = [x["title"] for x in exposed["fixes"]]
    assert any("ZeRO stage 3 -> 2" in t for t in titles)
    assert any("stage3_param_persistence_threshold: 0" in t for t in titles)  # 8 kept whole
    assert any("communication_data_type: bf16" in t for t in titles)  # fp32 reductions
    assert all(x["code"].startswith("ds_config = {") for x in exposed["fixes"])
    estimated = {x["title"].split(" (")[0] for x in exposed["fixes"]
                 if x.get("estimated_speedup")}
    assert estimated == {"ZeRO stage 3 -> 2 where the parameters fit whole on each rank",
                         "Reduce the gradients in bf16"}
    assert exposed["fixes"][0]["title"].startswith("ZeRO stage 3 -> 2")  # the best estimate
