"""The settings doctor try can change: checking, --set parsing, merging, describing."""

from __future__ import annotations

import pytest

from doctor.errors import UsageError
from doctor.tuning import describe, key_of, merge, normalize, parse_set


def test_normalize_converts_and_expands_the_short_form() -> None:
    assert normalize({"pin_memory": "true"}) == {"dataloader": {"pin_memory": True}}
    assert normalize({"dataloader": {"num_workers": "4"}, "ddp": {"bucket_cap_mb": "50"}}) == \
        {"dataloader": {"num_workers": 4}, "ddp": {"bucket_cap_mb": 50}}
    assert normalize({"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}) == \
        {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}


@pytest.mark.parametrize("bad", [
    {"dataloader": {"num_workers": -1}}, {"dataloader": {"shuffle": True}},
    {"torch": {"num_threads": 0}}, {"nonsense": {"x": 1}}, {"env": {"1BAD": "x"}},
    {"torch": {"sharing_strategy": "pickle"}}, {"dataloader": {"pin_memory": "maybe"}},
    {"fsdp1": {"sharding_strategy": "ZERO3"}},
])
def test_normalize_refuses_what_it_cannot_set(bad: dict) -> None:
    with pytest.raises(ValueError):
        normalize(bad)


def test_parse_set_finds_the_section_and_sweeps_values() -> None:
    assert parse_set("num_workers=0,2,4,8") == ("dataloader", "num_workers", [0, 2, 4, 8])
    assert parse_set("ddp.bucket_cap_mb=12.5") == ("ddp", "bucket_cap_mb", [12.5])
    assert parse_set("num_threads=1") == ("torch", "num_threads", [1])
    assert parse_set("compile=off") == ("torch", "compile", ["off"])
    # an enum's member: its name in any case, or as Python prints it
    assert parse_set("sharding_strategy=shard_grad_op,ShardingStrategy.FULL_SHARD") == \
        ("fsdp1", "sharding_strategy", ["SHARD_GRAD_OP", "FULL_SHARD"])
    assert parse_set("OMP_NUM_THREADS=2") == ("env", "OMP_NUM_THREADS", ["2"])
    # an environment value keeps its commas: it is not a sweep
    assert parse_set("env.PYTORCH_CUDA_ALLOC_CONF=a:1,b:2") == \
        ("env", "PYTORCH_CUDA_ALLOC_CONF", ["a:1,b:2"])


@pytest.mark.parametrize("text", ["num_workers", "=3", "batch_size=64", "colour=red",
                                  "num_workers=two"])
def test_parse_set_says_what_is_wrong_in_one_line(text: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_set(text)
    assert "\n" not in str(err.value)


def test_merge_refuses_two_values_of_one_setting() -> None:
    a = {"dataloader": {"num_workers": 2}}
    assert merge([a, {"dataloader": {"pin_memory": True}}]) == \
        {"dataloader": {"num_workers": 2, "pin_memory": True}}
    assert merge([a, {"dataloader": {"num_workers": 4}}]) is None
    assert merge([a, a]) == a


def test_describe_and_key() -> None:
    apply = {"dataloader": {"num_workers": 2}, "torch": {"num_threads": 1}}
    assert describe(apply) == "num_workers=2, torch.num_threads=1"
    assert key_of(apply) == key_of({"torch": {"num_threads": "1"},
                                    "dataloader": {"num_workers": 2}})
