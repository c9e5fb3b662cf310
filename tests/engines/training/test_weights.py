"""Checkpoint round trips, export to a plain HF directory, and named weights for the rollout engine."""

import json

import pytest
import torch
from safetensors import safe_open

from posttrain import keys
from posttrain.engines.training import TrainingEngine
from posttrain.engines.training.weights import export_hf
from posttrain.models import cached_tiny_model
from tests.engines.training.helpers import engine_config, make_batch, max_difference, parameters, ppo_loss, trained


def _checkpoint_names(model_dir):
    names = set()
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            names.update(f.keys())
    return names


def _logits(model, batch):
    # The engine's attention kernels on CPU (eager), which round differently from an exported model's sdpa.
    model.set_attn_implementation("eager")
    with torch.no_grad():
        return model(input_ids=batch[keys.INPUT_IDS], attention_mask=batch[keys.ATTENTION_MASK],
                     position_ids=batch[keys.POSITION_IDS]).logits


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_a_checkpoint_round_trip_gives_the_identical_next_update(small_lm, tmp_path, lora_rank):
    first, second = make_batch(4, seed=1), make_batch(4, seed=2)
    config = engine_config(small_lm, warmup_steps=3, lora_rank=lora_rank)
    original = TrainingEngine(config)
    trained(original, first, ppo_loss, micro_batch_size=2)
    original.save_checkpoint(tmp_path / "ckpt")
    draw = torch.rand(3)
    expected = trained(original, second, ppo_loss, micro_batch_size=2)

    resumed = TrainingEngine(config)
    assert max_difference(parameters(resumed), parameters(original)) > 0
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert torch.equal(torch.rand(3), draw)  # the random state came back too
    metrics = trained(resumed, second, ppo_loss, micro_batch_size=2)
    assert metrics["actor/lr"] == expected["actor/lr"] == pytest.approx(2 / 3 * 1e-3)  # the schedule resumed
    assert metrics["actor/grad_norm"] == expected["actor/grad_norm"]
    assert resumed.global_step == original.global_step == 2
    after, reference = parameters(resumed), parameters(original)
    assert all(torch.equal(after[k], reference[k]) for k in reference)  # bitwise


def test_loading_a_directory_that_is_not_a_checkpoint_says_so(small_lm, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a complete training-engine checkpoint"):
        TrainingEngine(engine_config(small_lm)).load_checkpoint(tmp_path)


def test_export_loads_in_transformers_with_the_same_logits_and_tokenizer(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = cached_tiny_model("llama")  # has the SmolLM2 tokenizer
    engine = TrainingEngine(engine_config(source))
    batch = make_batch(3, seed=3, vocab=1000)
    trained(engine, batch, ppo_loss)
    engine.export_hf(tmp_path / "export")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32)
    torch.testing.assert_close(_logits(exported, batch), _logits(engine.module.eval(), batch), atol=1e-5, rtol=0)
    assert max_difference(parameters(engine), dict(exported.state_dict())) == 0
    assert AutoTokenizer.from_pretrained(tmp_path / "export").chat_template
    assert _checkpoint_names(tmp_path / "export") == _checkpoint_names(source)


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_an_export_of_several_checkpoints_writes_the_mean_of_their_weights(small_lm, tmp_path, lora_rank):
    from transformers import AutoModelForCausalLM

    engine = TrainingEngine(engine_config(small_lm, lora_rank=lora_rank, lora_alpha=8))
    seen = []
    for step in range(3):  # three updates, a checkpoint after each
        trained(engine, make_batch(4, seed=10 + step), ppo_loss)
        engine.save_checkpoint(tmp_path / f"ckpt{step}")
        seen.append(parameters(engine))
    assert min(max_difference(a, b) for a, b in zip(seen, seen[1:])) > 1e-5  # each update moved the weights
    engine.load_checkpoint(tmp_path / "ckpt0")
    # the mean of the last two, LoRA merged before the mean (the mean of merged weights, not of A and B)
    engine.export_hf(tmp_path / "mean", average=[tmp_path / "ckpt1", tmp_path / "ckpt2"])
    exported = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "mean", dtype=torch.float32).state_dict())
    mean = {name: (seen[1][name] + seen[2][name]) / 2 for name in seen[2]}
    assert max_difference({name: exported[name] for name in mean}, mean) < 1e-7
    assert max_difference(mean, seen[2]) > 1e-5  # not the last checkpoint alone
    assert max_difference(parameters(engine), seen[2]) == 0  # the engine's weights are left at the last one


def test_tied_embeddings_are_exported_once_and_stay_tied(small_lm_tied, tmp_path):
    from transformers import AutoModelForCausalLM

    engine = TrainingEngine(engine_config(small_lm_tied))
    names = [name for name, _ in engine.named_weights()]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    trained(engine, make_batch(2), ppo_loss)
    engine.export_hf(tmp_path)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert exported.lm_head.weight.data_ptr() == exported.model.embed_tokens.weight.data_ptr()
    batch = make_batch(2)
    torch.testing.assert_close(_logits(exported, batch), _logits(engine.module.eval(), batch), atol=1e-5, rtol=0)


def test_lora_export_is_merged_and_equals_the_adapted_model(small_lm, tmp_path):
    from transformers import AutoModelForCausalLM

    engine = TrainingEngine(engine_config(small_lm, lora_rank=4, lora_alpha=8))
    base = parameters(engine)
    trainable = {n for n, p in engine.module.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)  # the base is frozen
    batch = make_batch(4, seed=4)
    for _ in range(2):  # lora_B starts at 0: the first step leaves the merged weights unchanged
        trained(engine, batch, ppo_loss)
    merged = parameters(engine)
    assert merged.keys() == base.keys() == _checkpoint_names(small_lm)
    assert max_difference(merged, base) > 1e-4
    assert torch.equal(merged["model.norm.weight"], base["model.norm.weight"])  # not a LoRA target
    engine.export_hf(tmp_path)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    torch.testing.assert_close(_logits(exported, batch), _logits(engine.module.eval(), batch), atol=1e-5, rtol=0)
    # With the adapters off, the engine is its own frozen reference policy.
    reference, _ = TrainingEngine(engine_config(small_lm)).compute_logprobs(batch)
    adapted, _ = engine.compute_logprobs(batch)
    assert torch.equal(engine.compute_logprobs(batch, without_adapters=True)[0], reference)
    assert (adapted - reference).abs().max() > 1e-4


def test_critic_export_reloads_as_a_token_classifier(small_lm, tmp_path):
    from transformers import AutoModelForTokenClassification

    engine = TrainingEngine(engine_config(small_lm, value_head=True, lora_rank=4))
    batch = make_batch(3, seed=5)
    engine.export_hf(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["LlamaForTokenClassification"]
    exported = AutoModelForTokenClassification.from_pretrained(tmp_path, dtype=torch.float32).eval()
    torch.testing.assert_close(_logits(exported, batch), _logits(engine.module.eval(), batch), atol=1e-5, rtol=0)


def test_a_large_model_is_exported_in_shards_with_an_index(small_lm, tmp_path):
    from transformers import AutoModelForCausalLM

    engine = TrainingEngine(engine_config(small_lm))
    export_hf(engine.module, tmp_path, source_dir=small_lm, write=True, max_shard_bytes=100_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    exported = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert max_difference(parameters(engine), dict(exported.state_dict())) == 0


def test_an_export_toward_the_base_puts_every_weight_on_the_line_from_the_base_to_the_policy(small_lm, tmp_path):
    from transformers import AutoModelForCausalLM

    engine = TrainingEngine(engine_config(small_lm))
    base = parameters(engine)
    export_hf(engine.module, tmp_path / "base", source_dir=small_lm, write=True, max_shard_bytes=100_000)  # in shards
    for _ in range(2):
        trained(engine, make_batch(4, seed=6), ppo_loss)
    tuned = parameters(engine)
    assert max_difference(base, tuned) > 1e-4
    for weight in (0.0, 0.25, 1.0, 2.5):  # 2.5: past the policy, on the same line (ExPO)
        engine.export_hf(tmp_path / f"mix{weight}", toward=(tmp_path / "base", weight))
        mixed = dict(AutoModelForCausalLM.from_pretrained(tmp_path / f"mix{weight}", dtype=torch.float32).state_dict())
        assert mixed.keys() == tuned.keys()
        for name in tuned:
            torch.testing.assert_close(mixed[name], base[name] + weight * (tuned[name] - base[name]), atol=1e-6, rtol=0)
        if weight in (0.0, 1.0):  # exact at both ends
            assert max_difference(mixed, base if weight == 0.0 else tuned) == 0
    assert _checkpoint_names(tmp_path / "mix0.25") == _checkpoint_names(small_lm)


def test_an_export_toward_a_model_of_other_weights_or_shapes_is_refused_and_writes_nothing(small_lm, small_lm_tied, tmp_path):
    from safetensors.torch import load_file, save_file

    engine = TrainingEngine(engine_config(small_lm))
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.safetensors").write_text("an earlier export")
    with pytest.raises(ValueError, match="holds other weights than the policy.*lm_head"):
        engine.export_hf(out, toward=(small_lm_tied, 0.5))
    tensors = load_file(str(small_lm / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"][:3].clone()
    (tmp_path / "narrow").mkdir()
    save_file(tensors, str(tmp_path / "narrow" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model.norm.weight: shape \(3,\) in"):
        engine.export_hf(out, toward=(tmp_path / "narrow", 0.5))
    for weight in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite number, 0 or above: 0 is the model trained from, 1 the trained policy, above 1"):
            engine.export_hf(out, toward=(small_lm, weight))
    with pytest.raises(ValueError, match="no model.safetensors"):
        engine.export_hf(out, toward=(tmp_path, 0.5))
    assert (out / "model.safetensors").read_text() == "an earlier export"  # refused before anything was removed


def test_a_tied_policy_moves_toward_a_base_that_stores_its_head_twice(small_lm_tied, tmp_path):
    from safetensors.torch import load_file, save_file

    engine = TrainingEngine(engine_config(small_lm_tied))
    tensors = load_file(str(small_lm_tied / "model.safetensors"))
    assert "lm_head.weight" not in tensors
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    (tmp_path / "untied").mkdir()
    save_file(tensors, str(tmp_path / "untied" / "model.safetensors"))
    engine.export_hf(tmp_path / "out", toward=(tmp_path / "untied", 0.5))
    assert _checkpoint_names(tmp_path / "out") == _checkpoint_names(small_lm_tied)
