"""Frameworks' own words: where the job runs under the Hugging Face Trainer, Accelerate, PyTorch
Lightning (or Lightning Fabric) or DeepSpeed, each fix also says the framework's own setting
beside the plain PyTorch one: ``TrainingArguments(dataloader_num_workers=2)`` beside
``DataLoader(num_workers=2)``, ``Trainer(precision="bf16-mixed")`` beside autocast.

FRAMEWORKS is the one table: per framework, where its settings go (its places: the
TrainingArguments, the Lightning Trainer, the LightningDataModule's ``train_dataloader``, a
DeepSpeed config...) and how each knob is spelled there. What a fix changes (its knobs) comes
from its ``apply`` (the DataLoader's and the optimizer's settings, TF32, DDP's buckets: what
``doctor try`` sets in the DataLoader and the optimizer the framework builds, so a try measures
the framework's setting too) and, for fixes that need code, from the snippets the rules write
(doctor.rules.knobs). The framework is the one whose code stepped the optimizer
(doctor.record.process_facts.framework_facts); a loop of the job's own gets no other words.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from doctor.analyse.stages import JobFacts
from doctor.rules.knobs import fix_knobs
from doctor.verdict import Finding, Fix

Spelling = str | Mapping[Any, str]  # a template ({v}: the value), or one per value


@dataclass(frozen=True)
class Place:
    """Where a framework takes some of its settings: ``code`` ({settings}, and {cls}, {batch})
    is shown, ``short`` ({settings}) is said in the fix's why; ``json``: the settings are
    written as JSON (a DeepSpeed config); ``sep`` joins them."""

    short: str
    code: str
    json: bool = False
    sep: str = ", "  # between settings


@dataclass(frozen=True)
class Framework:
    name: str  # as said in a sentence: "the Hugging Face Trainer"
    places: Mapping[str, Place]
    knobs: Mapping[str, tuple[str, Spelling]]  # knob -> (place, its spelling there)


_LOADER = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")

FRAMEWORKS: dict[str, Framework] = {
    "hf_trainer": Framework(
        "the Hugging Face Trainer",
        {"args": Place("TrainingArguments({settings})",
                       "args = TrainingArguments(..., {settings})"),
         "trainer": Place("Trainer({settings})", "trainer = Trainer(..., {settings})")},
        {**{k: ("args", f"dataloader_{k}={{v}}") for k in _LOADER},
         "precision": ("args", {"bf16": "bf16=True", "fp16": "fp16=True"}),
         "accumulation": ("args", "gradient_accumulation_steps={v}"),
         "micro_batch": ("args", "per_device_train_batch_size={v}"),
         "compile": ("args", "torch_compile=True"),
         "compile_mode": ("args", "torch_compile_mode={v}"),
         "tf32": ("args", "tf32=True"),
         "checkpointing": ("args", "gradient_checkpointing=True"),
         "bucket_cap_mb": ("args", "ddp_bucket_cap_mb={v}"),
         "fused_adamw": ("args", 'optim="adamw_torch_fused"'),
         "fused": ("trainer", "optimizers=(torch.optim.{cls}(model.parameters(), lr=lr, "
                             "fused=True), None)"),
         "foreach": ("trainer", "optimizers=(torch.optim.{cls}(model.parameters(), lr=lr, "
                               "foreach=True), None)")}),
    "accelerate": Framework(
        "Accelerate",
        {"accelerator": Place("Accelerator({settings})",
                              "accelerator = Accelerator(..., {settings})"),
         "loader": Place("DataLoader(batch_size={batch}, {settings}) given to "
                         "accelerator.prepare()",
                         "loader = DataLoader(dataset, batch_size={batch}, {settings})\n"
                         "loader = accelerator.prepare(loader)"),
         "optimizer": Place("torch.optim.{cls}({settings}) given to accelerator.prepare()",
                            "optimizer = torch.optim.{cls}(model.parameters(), lr=lr, "
                            "{settings})\nmodel, optimizer = accelerator.prepare(model, "
                            "optimizer)"),
         "accumulate": Place("Accelerator({settings}) and accelerator.accumulate(model) "
                             "around each step",
                             "accelerator = Accelerator(..., {settings})\n"
                             "for batch in loader:\n    with accelerator.accumulate(model):\n"
                             "        accelerator.backward(loss_fn(model(batch)))\n"
                             "        optimizer.step()\n        optimizer.zero_grad()"),
         "ddp": Place("DistributedDataParallelKwargs({settings})",
                      "from accelerate.utils import DistributedDataParallelKwargs\n"
                      "accelerator = Accelerator(kwargs_handlers=["
                      "DistributedDataParallelKwargs({settings})])"),
         "scaler": Place("GradScalerKwargs({settings})",
                         "from accelerate.utils import GradScalerKwargs\n"
                         "accelerator = Accelerator(mixed_precision=\"fp16\", "
                         "kwargs_handlers=[GradScalerKwargs({settings})])")},
        {**{k: ("loader", f"{k}={{v}}") for k in _LOADER},
         "precision": ("accelerator", "mixed_precision={v}"),
         "accumulation": ("accumulate", "gradient_accumulation_steps={v}"),
         "micro_batch": ("loader", ""),  # the loader's batch_size
         "compile": ("accelerator", 'dynamo_backend="inductor"'),
         "fused": ("optimizer", "fused=True"), "foreach": ("optimizer", "foreach=True"),
         "bucket_cap_mb": ("ddp", "bucket_cap_mb={v}"),
         "gradient_as_bucket_view": ("ddp", "gradient_as_bucket_view={v}"),
         "scale_power": ("scaler", "init_scale=2.0**{v}"),
         "growth_interval": ("scaler", "growth_interval={v}")}),
    "lightning": Framework(
        "PyTorch Lightning",
        {"trainer": Place("Trainer({settings})", "trainer = L.Trainer(..., {settings})"),
         "loader": Place("DataLoader(batch_size={batch}, {settings}) in the "
                         "LightningDataModule's train_dataloader() (or the one given to "
                         "trainer.fit)",
                         "def train_dataloader(self):  # in your LightningDataModule\n"
                         "    return DataLoader(self.dataset, batch_size={batch}, {settings})"),
         "optimizer": Place("torch.optim.{cls}({settings}) in configure_optimizers()",
                            "def configure_optimizers(self):  # in your LightningModule\n"
                            "    return torch.optim.{cls}(self.parameters(), lr=self.lr, "
                            "{settings})"),
         "compile": Place("torch.compile(model{settings}) of the LightningModule before "
                          "trainer.fit",
                          "model = torch.compile(model{settings})  # your LightningModule\n"
                          "trainer.fit(model, datamodule)", sep=""),
         "ddp": Place("DDPStrategy({settings})",
                      "from lightning.pytorch.strategies import DDPStrategy\n"
                      "trainer = L.Trainer(..., strategy=DDPStrategy({settings}))"),
         "scaler": Place("a MixedPrecision plugin with GradScaler({settings})",
                         "from lightning.pytorch.plugins import MixedPrecision\n"
                         "scaler = torch.amp.GradScaler(\"cuda\", {settings})\n"
                         "trainer = L.Trainer(..., plugins=[MixedPrecision(\"16-mixed\", "
                         "\"cuda\", scaler)])")},
        {**{k: ("loader", f"{k}={{v}}") for k in _LOADER},
         "precision": ("trainer", {"bf16": 'precision="bf16-mixed"',
                                   "fp16": 'precision="16-mixed"'}),
         "accumulation": ("trainer", "accumulate_grad_batches={v}"),
         "micro_batch": ("loader", ""),  # the loader's batch_size
         "compile": ("compile", ""), "compile_mode": ("compile", ", mode={v}"),
         "fused": ("optimizer", "fused=True"), "foreach": ("optimizer", "foreach=True"),
         "bucket_cap_mb": ("ddp", "bucket_cap_mb={v}"),
         "gradient_as_bucket_view": ("ddp", "gradient_as_bucket_view={v}"),
         "scale_power": ("scaler", "init_scale=2.0**{v}"),
         "growth_interval": ("scaler", "growth_interval={v}")}),
    "fabric": Framework(
        "Lightning Fabric",
        {"fabric": Place("Fabric({settings})", "fabric = L.Fabric(..., {settings})"),
         "loader": Place("DataLoader({settings}) given to fabric.setup_dataloaders()",
                         "loader = fabric.setup_dataloaders(\n"
                         "    DataLoader(dataset, batch_size={batch}, {settings}))"),
         "optimizer": Place("torch.optim.{cls}({settings}) given to fabric.setup()",
                            "optimizer = torch.optim.{cls}(model.parameters(), lr=lr, "
                            "{settings})\nmodel, optimizer = fabric.setup(model, optimizer)")},
        {**{k: ("loader", f"{k}={{v}}") for k in _LOADER},
         "precision": ("fabric", {"bf16": 'precision="bf16-mixed"',
                                  "fp16": 'precision="16-mixed"'}),
         "fused": ("optimizer", "fused=True"), "foreach": ("optimizer", "foreach=True")}),
    "deepspeed": Framework(
        "DeepSpeed",
        {"config": Place("the DeepSpeed config's {settings}",
                         "ds_config = {{\n    ...,\n    {settings},\n}}", json=True),
         "fp16": Place('the DeepSpeed config\'s "fp16": {{{settings}}}',
                       'ds_config = {{\n    ...,\n    "fp16": {{"enabled": true, {settings}}},\n}}',
                       json=True),
         "engine": Place("engine.compile()", "engine, *_ = deepspeed.initialize(...)\n"
                                             "engine.compile()")},
        {"precision": ("config", {"bf16": '"bf16": {"enabled": true}',
                                  "fp16": '"fp16": {"enabled": true}'}),
         "accumulation": ("config", '"gradient_accumulation_steps": {v}'),
         "micro_batch": ("config", '"train_micro_batch_size_per_gpu": {v}'),
         "compile": ("engine", ""),
         "scale_power": ("fp16", '"initial_scale_power": {v}'),
         "growth_interval": ("fp16", '"loss_scale_window": {v}')}),
}


def framework_name(key: str | None) -> str | None:
    framework = FRAMEWORKS.get(key or "")
    return framework.name if framework else None


def job_framework(job: JobFacts) -> dict[str, Any]:
    """The verdict's job key for the framework (none for a loop of the job's own)."""
    name = framework_name(job.framework)
    if name is None:
        return {}
    name = name.removeprefix("the ")
    return {"framework": f"{name} {job.framework_version}" if job.framework_version else name}


def in_framework_words(findings: Iterable[Finding], job: JobFacts,
                       loaders: pd.DataFrame | None = None) -> list[Finding]:
    """``findings`` with each fix that the job's framework spells in its own words saying them
    (in its why, and first in its code, the plain PyTorch code after)."""
    framework = FRAMEWORKS.get(job.framework or "")
    if framework is None:
        return list(findings)
    batch = _batch_size(loaders)
    out = []
    for f in findings:
        cls = f.evidence.get("optimizer") if isinstance(f.evidence.get("optimizer"), str) \
            else None
        fixes = tuple(worded(x, framework, cls=cls, batch=batch) for x in f.fixes)
        out.append(f if fixes == f.fixes else replace(f, fixes=fixes))
    return out


def worded(fix: Fix, framework: Framework, cls: str | None = None,
           batch: int | None = None) -> Fix:
    """``fix`` saying ``framework``'s own settings for what it changes, where it spells them."""
    knobs = fix_knobs(fix)
    if knobs.get("fused") and cls == "AdamW" and "fused_adamw" in framework.knobs:
        knobs = {**{k: v for k, v in knobs.items() if k != "fused"}, "fused_adamw": True}
    fill = {"cls": cls or "AdamW",
            "batch": knobs.get("micro_batch") or batch or "batch_size"}
    by_place: dict[str, list[str]] = {}
    for knob, value in knobs.items():
        if knob not in framework.knobs:
            continue
        place, spelling = framework.knobs[knob]
        text = _spelled(spelling, value, framework.places[place].json, fill)
        if text is not None:
            by_place.setdefault(place, []).append(text)
    if not by_place:
        return fix
    shorts, codes = [], []
    for place, settings in by_place.items():
        spot = framework.places[place]
        joined = spot.sep.join(s for s in settings if s)
        short, code = spot.short, spot.code
        if not joined:  # the knobs said by the place itself (a loader's batch_size)
            short, code = (t.replace(", {settings}", "") for t in (short, code))
        shorts.append(short.format(settings=joined, **fill))
        codes.append(code.format(settings=joined, **fill))
    said = f"With {framework.name}: {'; '.join(shorts)}."
    code = "\n".join(codes)
    if fix.code.strip():
        code = f"# with {framework.name}:\n{code}\n# in plain PyTorch:\n{fix.code}"
    why = fix.why.rstrip()
    why = f"{why}{'' if why.endswith(('.', '!', '?')) else '.'} {said}" if why else said
    return replace(fix, why=why, code=code)


def _spelled(spelling: Spelling, value: Any, as_json: bool, fill: Mapping[str, Any]
             ) -> str | None:
    if isinstance(spelling, Mapping):
        return spelling.get(value)
    if value is False and "{v}" not in spelling:
        return None  # a flag the fix turns off: the framework's "on" spelling does not fit
    return spelling.format(v=_literal(value, as_json), **fill)


def _literal(value: Any, as_json: bool) -> str:
    if as_json or isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _batch_size(loaders: pd.DataFrame | None) -> int | None:
    """The training loader's batch size (the first loader's, where they are known)."""
    if loaders is None or loaders.empty or "batch_size" not in loaders:
        return None
    sizes = [v for v in loaders["batch_size"] if isinstance(v, int | float) and v == v]
    return int(sizes[0]) if sizes else None
