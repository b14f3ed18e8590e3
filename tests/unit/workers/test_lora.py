"""LoRA training: adapters alone train, the merged model is what leaves the trainer, the
base is the KL anchor, checkpoints hold the adapter and resume, and bad settings are refused."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, cast

import pydantic
import pytest
import torch
from peft import PeftModel
from tests.unit.workers.trainer_batches import two_groups
from transformers import AutoModelForCausalLM

from polyrl.api.lora import LoraSpec
from polyrl.api.resources import RLJobSpec
from polyrl.workers import export, preflight
from polyrl.workers.errors import ConfigError
from polyrl.workers.models import loading, lora, memory
from polyrl.workers.models.adapters import Adapter
from polyrl.workers.trainer import batching, learner

MODEL = "tiny-llama://lora-test"


def spec(lora_spec: dict[str, Any] | None = None, kl_coef: float = 0.0) -> RLJobSpec:
    trainer: dict[str, Any] = {"batchSize": 8, "microBatchSize": 4, "optimizer": {"lr": 1e-2}}
    if lora_spec is not None:
        trainer["lora"] = lora_spec
    return RLJobSpec.model_validate(
        {
            "policies": [{"name": "solver", "model": {"path": MODEL}, "trainer": trainer}],
            "algorithm": {"groupSize": 4, "klCoef": kl_coef},
        }
    )


def make(workdir: Path, lora_spec: dict[str, Any] | None = None, **kw: Any) -> learner.Learner:
    job = spec(lora_spec, **kw)
    made = learner.Learner(job.policies[0], job.algorithm, workdir=workdir)
    made.sync_from_leader()
    return made


def plain(workdir: Path, dtype: torch.dtype = torch.float32) -> Any:
    model, _ = loading.load_directory(loading.ensure_tiny_llama("lora-test", workdir), dtype=dtype)
    return model


def snapshot(named: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in named}


def test_only_the_adapters_train_and_only_they_have_optimizer_state(tmp_path: Path) -> None:
    t = make(tmp_path, {"rank": 4})
    frozen = snapshot((k, v) for k, v in t.model.named_parameters() if not v.requires_grad)
    adapters = snapshot((k, v) for k, v in t.model.named_parameters() if v.requires_grad)
    assert adapters
    assert all(".lora_" in k for k in adapters)
    t.step(two_groups())
    t.step(two_groups())
    after = dict(t.model.named_parameters())
    assert all(torch.equal(after[k], v) for k, v in frozen.items())
    assert any(not torch.equal(after[k], v) for k, v in adapters.items())
    state = t.optimizer.state_dict()["state"]
    assert len(state) == len(adapters)  # no moments for the base's weights
    assert sum(p.numel() for p in lora.trainable(t.model)) < 0.2 * sum(
        p.numel() for p in t.model.parameters()
    )


def test_the_published_weights_are_the_merged_model_under_the_base_models_names(
    tmp_path: Path,
) -> None:
    t = make(tmp_path, {"rank": 4})
    for _ in range(2):
        t.step(two_groups())
    ours = t.weights()
    reference = copy.deepcopy(t.model).merge_and_unload()  # PEFT's own merge
    theirs = reference.state_dict()
    assert list(ours) == list(plain(tmp_path / "m").state_dict())
    assert ours.keys() == theirs.keys()
    for key, tensor in theirs.items():
        torch.testing.assert_close(ours[key], tensor, rtol=0, atol=1e-6, msg=key)
    # the merge is computed beside the base: the frozen base is untouched by it
    base = dict(t.model.named_parameters())
    before = snapshot((k, v) for k, v in base.items() if ".base_layer." in k)
    t.weights()
    assert all(torch.equal(base[k], v) for k, v in before.items())


def test_adapter_sync_sends_the_base_once_and_adapters_an_engine_merges_as_peft_does(
    tmp_path: Path,
) -> None:
    """What `sync: adapter` publishes: the frozen base (bf16, the base model's names) and the
    adapter (bf16, PEFT's file names); merged by `adapters.Adapter` they are PEFT's merge up
    to the adapter's rounding to bf16; and the files `Adapter.save` writes (what vLLM loads)
    are ones PEFT itself loads to the same model."""
    t = make(tmp_path, {"rank": 4, "alpha": 16})
    for _ in range(2):
        t.step(two_groups())
    assert t.sends_adapters
    base, sent = t.base_bf16(), t.published()
    assert list(base) == list(plain(tmp_path / "m").state_dict())
    assert all(v.dtype == torch.bfloat16 for v in (*base.values(), *sent.values()))
    assert sent.keys() == lora.adapter_state(t.model).keys()
    adapter = Adapter(sent, 16)
    assert (adapter.rank, adapter.scale) == (4, 4.0)
    merged, base32 = t.bf16(), lora.merged_state(t.model, merge=False)
    exact = Adapter(lora.adapter_state(t.model), 16)  # float32
    for name, tensor in base.items():
        ours = (adapter.merged(name, tensor) if name in adapter.pairs else tensor).float()
        theirs = merged[name].float()
        # Each side rounds to bf16 (2^-8 relative) at other points: the base, A and B (the
        # update's terms |B| |A|, scaled), and the result; their errors bound the difference.
        terms = torch.zeros_like(theirs)
        if name in exact.pairs:
            a, b = exact.pairs[name]
            terms = exact.scale * (b.abs() @ a.abs())
        bound = 2**-7 * (base32[name].abs() + terms + theirs.abs()) + 1e-7
        assert bool(((ours - theirs).abs() <= bound).all()), name
    assert set(adapter.pairs) == {
        k.removeprefix("base_model.model.").replace(".base_layer.weight", ".weight")
        for k, _ in t.model.named_parameters()
        if k.endswith(".base_layer.weight")
    }
    adapter.save(tmp_path / "adapter")
    fresh = plain(tmp_path / "m2")
    fresh.load_state_dict(base)
    loaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").merge_and_unload()
    for name, tensor in loaded.state_dict().items():
        expected = adapter.merged(name, base[name]) if name in adapter.pairs else base[name]
        assert torch.equal(tensor.to(torch.bfloat16), expected), name


def test_merged_sync_keeps_publishing_the_merged_model(tmp_path: Path) -> None:
    t = make(tmp_path, {"rank": 4, "sync": "merged"})
    assert not t.sends_adapters
    sent, merged = t.published(), t.bf16()
    assert sent.keys() == merged.keys()
    assert all(torch.equal(sent[k], v) for k, v in merged.items())


def test_lora_gradients_equal_the_chain_rule_through_a_hand_merged_model_in_float64(
    tmp_path: Path,
) -> None:
    """d/dB = s G A^T and d/dA = s B^T G, with G the gradient of the merged weight."""
    samples = two_groups()
    batch = batching.collate(samples, 0)

    def loss(model: Any) -> torch.Tensor:
        lp = batching.completion_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.loss_mask, 1.0
        )
        return (lp * batch.loss_mask * torch.linspace(0.5, 1.5, lp.shape[0])[:, None]).sum()

    wrapped = lora.wrap(plain(tmp_path, torch.float64), LoraSpec(rank=3, alpha=5))
    torch.manual_seed(1)
    for name, param in wrapped.named_parameters():
        if ".lora_B." in name:  # B starts at zero, which would make d/dA vanish
            param.data.normal_(0, 0.05)
    loss(wrapped).backward()  # type: ignore[no-untyped-call]
    merged = plain(tmp_path, torch.float64)
    merged.load_state_dict(lora.merged_state(wrapped))
    loss(merged).backward()  # type: ignore[no-untyped-call]
    grads = {k: v.grad for k, v in merged.named_parameters()}
    scale, checked = 5 / 3, 0
    for name, module in wrapped.get_base_model().named_modules():
        if not isinstance(module, lora.LoraLayer):
            continue
        a = cast(torch.Tensor, module.lora_A[lora.ADAPTER].weight)
        b = cast(torch.Tensor, module.lora_B[lora.ADAPTER].weight)
        g = grads[f"{name}.weight"]
        assert a.grad is not None
        assert b.grad is not None
        assert g is not None
        torch.testing.assert_close(b.grad, scale * g @ a.T, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(a.grad, scale * b.T @ g, rtol=1e-9, atol=1e-12)
        checked += 1
    assert checked >= 7  # q, k, v, o, gate, up, down of at least one layer


def test_the_kl_anchor_is_the_base_with_the_adapters_off(tmp_path: Path) -> None:
    t = make(tmp_path, {"rank": 4}, kl_coef=0.1)
    assert t.reference is None  # no second copy of the model
    for _ in range(2):
        t.step(two_groups())
    batch = batching.collate(two_groups(), 0)
    anchor = t._reference_logprobs(batch)
    base = batching.completion_logprobs(
        plain(tmp_path / "m"), batch.input_ids, batch.attention_mask, batch.loss_mask, 1.0
    )
    assert anchor is not None
    torch.testing.assert_close(anchor, base, rtol=0, atol=1e-6)
    assert t.step(two_groups())["kl_mean"] > 1e-7  # the adapters moved it from the base


def test_a_checkpoint_holds_the_adapter_and_its_optimizer_state_and_resumes(
    tmp_path: Path,
) -> None:
    first = make(tmp_path, {"rank": 4})
    for _ in range(2):
        first.step(two_groups())
    first.save()
    saved = tmp_path / "checkpoint"
    assert (saved / "adapter_model.safetensors").is_file()
    assert not (saved / "model.safetensors").exists()  # the base is not copied
    resumed = make(tmp_path, {"rank": 4})
    assert resumed.state.step == 2
    ours, theirs = first.weights(), resumed.weights()
    assert all(torch.equal(ours[k], v) for k, v in theirs.items())
    a, b = first.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    assert a.keys() == b.keys()
    assert all(torch.equal(a[i]["exp_avg_sq"], b[i]["exp_avg_sq"]) for i in a)


def test_a_checkpoint_resumed_with_another_lora_setting_is_refused(tmp_path: Path) -> None:
    make(tmp_path / "adapter", {"rank": 4}).save()
    make(tmp_path / "full").save()
    with pytest.raises(ConfigError, match=r"holds an adapter and trainer\.lora is not set"):
        make(tmp_path / "adapter")
    with pytest.raises(ConfigError, match=r"holds full weights and trainer\.lora is now set"):
        make(tmp_path / "full", {"rank": 4})
    with pytest.raises(ConfigError, match=r"does not fit trainer\.lora"):
        make(tmp_path / "adapter", {"rank": 8})


def test_export_writes_the_merged_model_or_the_adapter_alone_in_peft_format(
    tmp_path: Path,
) -> None:
    t = make(tmp_path, {"rank": 4})
    t.step(two_groups())
    t.save()
    out = export.export_checkpoint(tmp_path / "checkpoint", tmp_path / "merged", dtype="float32")
    loaded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for key, tensor in t.weights().items():
        torch.testing.assert_close(loaded[key], tensor, rtol=0, atol=1e-6, msg=key)
    adapter = export.export_checkpoint(tmp_path / "checkpoint", tmp_path / "ad", adapter=True)
    again = PeftModel.from_pretrained(plain(tmp_path / "m"), adapter).merge_and_unload()
    for key, tensor in again.state_dict().items():
        torch.testing.assert_close(tensor, t.weights()[key], rtol=0, atol=1e-6, msg=key)
    make(tmp_path / "full").save()
    with pytest.raises(export.ExportError, match="--adapter needs a LoRA"):
        export.export_checkpoint(tmp_path / "full" / "checkpoint", tmp_path / "x", adapter=True)


@pytest.mark.parametrize(
    ("targets", "said"),
    [(["nope_proj"], "nope_proj"), (["norm"], "not supported")],
    ids=["a-name-that-matches-nothing", "a-layer-type-lora-cannot-adapt"],
)
def test_lora_settings_that_cannot_work_are_refused_with_the_reason(
    tmp_path: Path, targets: list[str], said: str
) -> None:
    with pytest.raises(ConfigError, match=rf"trainer\.lora.*{said}"):
        lora.wrap(plain(tmp_path), LoraSpec(target_modules=targets))


@pytest.mark.parametrize("rank", [0, -1], ids=["zero", "negative"])
def test_a_rank_below_one_is_refused_by_the_schema(rank: int) -> None:
    with pytest.raises(pydantic.ValidationError, match="rank"):
        spec({"rank": rank})


def test_preflight_refuses_unmatched_target_modules_before_any_weights_load(
    tmp_path: Path,
) -> None:
    directory = loading.ensure_tiny_llama("lora-test", tmp_path)
    job = spec({"targetModules": ["nope_proj"]})
    job.policies[0].model.path = str(directory)
    with pytest.raises(ConfigError, match=r"policy 'solver': trainer\.lora .*nope_proj"):
        preflight.policy_model(job.policies[0])


def test_the_memory_estimate_counts_gradients_and_moments_for_the_adapters_alone() -> None:
    full = memory.trainer_bytes(1_000_000)
    adapted = memory.trainer_bytes(1_000_000, trainable=10_000)
    assert full == 16_000_000
    assert adapted == 4 * 990_000 + 16 * 10_000
