"""Frameworks' own words (doctor.rules.frameworks, doctor.rules.knobs): a job whose optimizer a
framework steps gets each fix in that framework's setting too, beside the plain PyTorch one; the
loader fix writes the loader's real batch size (a batch sampler's, as the Hugging Face Trainer
and Accelerate build theirs), never ``batch_size=None`` unless the loader batches nothing.

The recorded loops are built to look like what a real Trainer run records (transformers 5.25,
accelerate 1.16, torch 2.13 on this CPU): the framework read from the optimizer's stack, the
loader's batch size from its batch sampler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from doctor.analyse.memory import RankMemory
from doctor.analyse.precision import Precision
from doctor.analyse.stages import JobFacts
from doctor.pipeline import analyze_run
from doctor.record.session import STEP_BACKWARD, Session
from doctor.rules.frameworks import FRAMEWORKS, in_framework_words, worded
from doctor.rules.knobs import fix_knobs
from doctor.rules.memory_fit import memory_fixes
from doctor.rules.sound import PLAIN_COMPILE
from doctor.verdict import Finding, Fix
from tests.support import FakeClock, record_loop, write_record

#: the Trainer's training loader as the DataLoader probe records it: batches from a batch
#: sampler (the loader's own batch_size is None), the size read from the sampler
TRAINER_LOADER = {"num_workers": 0, "batch_size": 16, "batched": True, "pin_memory": False,
                  "persistent_workers": False, "prefetch_factor": None,
                  "loader_class": "accelerate.data_loader.DataLoaderShard",
                  "collate_fn": "RemoveColumnsCollator"}
TRAINER = {"framework": "hf_trainer", "framework_version": "5.25.0"}


#: What doctor.rules.iterations writes for a scaler that should grow less often
GROW_SLOWER = Fix("Let the scale grow less often", "",
                  "scaler = torch.amp.GradScaler(init_scale=2.0**10, growth_interval=4000)")

def verdict_of(run_dir: Path, loader: dict[str, Any], meta: dict[str, Any] | None,
               optimizer_share: float = 0.1) -> dict[str, Any]:
    record_loop(run_dir, 40, wait_s=0.03, compute_s=0.01, loader=loader, meta=meta)
    write_record(run_dir)
    return analyze_run(run_dir).verdict.to_dict()


def loader_fix(verdict: dict[str, Any]) -> dict[str, Any]:
    found = next(f for f in verdict["findings"] if f["id"] == "input.loader")
    return found["fixes"][0]


def test_a_trainer_job_is_told_dataloader_num_workers(tmp_path: Path) -> None:
    verdict = verdict_of(tmp_path, TRAINER_LOADER, TRAINER)
    fix = loader_fix(verdict)
    assert "TrainingArguments(..., dataloader_num_workers=" in fix["code"]
    assert "dataloader_num_workers=" in fix["why"]
    assert "batch_size=16" in fix["code"] and "batch_size=None" not in fix["code"]
    assert fix["apply"]["dataloader"]["num_workers"] >= 1  # doctor try sets the loader itself
    assert verdict["job"]["framework"] == "Hugging Face Trainer 5.25.0"


def test_a_loader_whose_batch_size_is_unknown_never_says_none(tmp_path: Path) -> None:
    # what an older doctor recorded of an Accelerate loader: batch_size None, batching on
    verdict = verdict_of(tmp_path, {**TRAINER_LOADER, "batch_size": None, "batched": None},
                         {"framework": "accelerate"})
    fix = loader_fix(verdict)
    assert "batch_size=None" not in fix["code"] and "batch_size=batch_size" in fix["code"]
    assert "accelerator.prepare(loader)" in fix["code"]


def test_a_loader_without_batching_keeps_batch_size_none(tmp_path: Path) -> None:
    verdict = verdict_of(tmp_path, {**TRAINER_LOADER, "batch_size": None, "batched": False},
                         None)
    fix = loader_fix(verdict)
    assert "batch_size=None" in fix["code"]
    assert "framework" not in verdict["job"] and "With " not in fix["why"]


def test_a_lightning_optimizer_is_fused_in_configure_optimizers(tmp_path: Path) -> None:
    adam = {"class": "Adam", "foreach": False, "fused": None, "tensors": 400, "device": "cpu"}
    clock = FakeClock()
    s = Session(tmp_path, clock=clock, window_start=10**9)
    s.update_meta(optimizers=[adam], torch_version="2.13.0+cpu", framework="lightning",
                  framework_version="2.6.6")
    for _ in range(40):
        s.count_step(STEP_BACKWARD)
        clock.tick(0.01)
        s.record_optimizer_start()  # as the closure returns: the optimizer's own half
        clock.tick(0.01)
        s.record_optimizer_end(0)
    s.close()
    write_record(tmp_path)
    verdict = analyze_run(tmp_path).verdict.to_dict()
    found = next(f for f in verdict["findings"] if f["id"] == "optimizer.unfused")
    fused = found["fixes"][0]
    assert "def configure_optimizers(self)" in fused["code"]
    assert "torch.optim.Adam(self.parameters(), lr=self.lr, fused=True)" in fused["code"]
    assert "configure_optimizers()" in fused["why"]
    assert fused["apply"] == {"optimizer": {"fused": True}}  # doctor try builds it fused
    assert verdict["job"]["framework"] == "PyTorch Lightning 2.6.6"


def test_the_trainer_names_its_fused_adamw_and_other_optimizers_its_own_way() -> None:
    fused = Fix("Fused", "", "optimizer = torch.optim.AdamW(..., fused=True)",
                apply={"optimizer": {"fused": True}})
    trainer = FRAMEWORKS["hf_trainer"]
    assert 'optim="adamw_torch_fused"' in worded(fused, trainer, cls="AdamW").code
    sgd = worded(fused, trainer, cls="SGD").code
    assert "Trainer(..., optimizers=(torch.optim.SGD(" in sgd and "adamw" not in sgd


@pytest.mark.parametrize(("framework", "words"), [
    ("hf_trainer", "TrainingArguments(..., bf16=True)"),
    ("lightning", 'L.Trainer(..., precision="bf16-mixed")'),
    ("fabric", 'L.Fabric(..., precision="bf16-mixed")'),
    ("accelerate", 'Accelerator(..., mixed_precision="bf16")'),
    ("deepspeed", '"bf16": {"enabled": true}'),
])
def test_precision_in_each_framework(framework: str, words: str) -> None:
    code = Precision("bfloat16", "measured", "cpu").autocast_code()
    fix = worded(Fix("Autocast", "faster", code), FRAMEWORKS[framework])
    assert words in fix.code and fix.code.endswith(code)
    assert fix.why.startswith("faster. With ")


def test_the_rules_snippets_read_back_as_their_knobs() -> None:
    """Each snippet a rule writes for a code fix says its knobs: a snippet changed in a rule
    cannot leave its framework's words behind."""
    bf16 = Precision("bfloat16", "", "cuda").autocast_code()
    fp16 = Precision("float16", "", "cuda").autocast_code()
    assert fix_knobs(Fix("", "", bf16)) == {"precision": "bf16"}
    assert fix_knobs(Fix("", "", fp16)) == {"precision": "fp16"}
    assert fix_knobs(Fix("", "", PLAIN_COMPILE)) == {"compile": True}
    assert fix_knobs(Fix("", "", 'model = torch.compile(model, mode="reduce-overhead")')) == \
        {"compile": True, "compile_mode": "reduce-overhead"}
    assert fix_knobs(GROW_SLOWER) == {"scale_power": 10, "growth_interval": 4000}
    assert fix_knobs(Fix("", "", "scaler = torch.amp.GradScaler(init_scale=2.0**8)")) == \
        {"scale_power": 8}
    memory = RankMemory(0, 0, "cuda", {"activations": 4e9, "parameters": 1e8},
                        by_dtype={"activations": {"cuda:float32": 4e9}}, batch_size=32)
    knobs = [fix_knobs(f) for f in memory_fixes(memory, 1)]
    assert {"micro_batch": 16, "accumulation": 2} in knobs
    assert {"checkpointing": True} in knobs and {"precision": "bf16"} in knobs


def test_every_spelling_of_every_framework_reads_whole() -> None:
    """Each knob a framework spells, alone and with the others of its place, makes code with no
    template left in it and a sentence that ends."""
    values = {"num_workers": 2, "pin_memory": True, "persistent_workers": True,
              "prefetch_factor": 4, "precision": "bf16", "accumulation": 2, "micro_batch": 8,
              "compile": True, "compile_mode": "max-autotune", "tf32": True,
              "checkpointing": True, "bucket_cap_mb": 50, "gradient_as_bucket_view": True,
              "fused": True, "fused_adamw": True, "foreach": True, "scale_power": 10,
              "growth_interval": 4000}
    assert not {k for f in FRAMEWORKS.values() for k in f.knobs} - set(values)
    for framework in FRAMEWORKS.values():
        for knob in framework.knobs:
            fix = worded(_fix_of(knob, values[knob]), framework, cls="Adam", batch=32)
            assert framework.name in fix.why, (framework.name, knob)
            for text in (fix.code, fix.why):
                assert "{" not in text.replace('{"', "").replace("{\n", "").replace(
                    "{'", ""), text
                assert "(, " not in text and ", )" not in text and ", ," not in text, text
            assert fix.why.endswith("."), fix.why


def _fix_of(knob: str, value: Any) -> Fix:
    """A fix that sets ``knob`` as a rule would write it."""
    applied = {"num_workers": "dataloader", "pin_memory": "dataloader",
               "persistent_workers": "dataloader", "prefetch_factor": "dataloader",
               "fused": "optimizer", "fused_adamw": "optimizer", "foreach": "optimizer",
               "bucket_cap_mb": "ddp", "gradient_as_bucket_view": "ddp"}
    if knob in applied:
        name = "fused" if knob == "fused_adamw" else knob
        return Fix("t", "w", "plain()", apply={applied[knob]: {name: value}})
    return Fix({"accumulation": "batch_size 16 -> 8, with 2 gradient accumulation steps",
                "micro_batch": "batch_size 16 -> 8, with 2 gradient accumulation steps"}
               .get(knob, "t"), "w", {
        "precision": 'with torch.autocast("cuda", dtype=torch.bfloat16):',
        "compile": PLAIN_COMPILE, "compile_mode": 'model = torch.compile(model, mode="x")',
        "tf32": "", "checkpointing": "checkpoint_sequential(model, 2, x)",
        "scale_power": GROW_SLOWER.code, "growth_interval": GROW_SLOWER.code,
    }.get(knob, ""), apply={"torch": {"matmul_precision": "high"}} if knob == "tf32" else None)


def test_a_loop_of_the_jobs_own_keeps_its_fixes_as_they_are() -> None:
    finding = Finding("x.y", "compute", "info", "t", fixes=(Fix("Compile", "w", PLAIN_COMPILE),))
    assert in_framework_words([finding], JobFacts()) == [finding]
    assert in_framework_words([finding], JobFacts(framework="unknown")) == [finding]


def test_a_fix_the_framework_has_no_words_for_is_left_as_it_is() -> None:
    threads = Fix("one thread", "w", "torch.set_num_threads(1)",
                  apply={"torch": {"num_threads": 1}})
    assert worded(threads, FRAMEWORKS["hf_trainer"]) == threads
    workers = Fix("workers", "w", "DataLoader(...)", apply={"dataloader": {"num_workers": 2}})
    assert worded(workers, FRAMEWORKS["deepspeed"]) == workers  # its loader is the job's own
