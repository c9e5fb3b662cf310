"""Small models, batches and losses shared by the training-engine tests (and their spawned ranks)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from posttrain import keys
from posttrain.algos import aggregate_loss, ppo_policy_loss, value_loss
from posttrain.engines.training import ForwardOutputs, TrainingEngine, TrainingEngineConfig, modeling
from posttrain.engines.training.inputs import build_model_inputs, lengths_to_mask, random_model_inputs
from posttrain.metrics import values
from posttrain.protocol import Batch

VOCAB = 256


def make_small_lm(out_dir: Path, *, tie_word_embeddings: bool = False, seed: int = 0) -> Path:
    """A random 2-layer llama (hidden 64, vocab 256) in HF format, without a tokenizer: loads in milliseconds."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=128, max_position_embeddings=256, tie_word_embeddings=tie_word_embeddings,
        initializer_range=0.1, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)
    return out_dir


def engine_config(model_dir: Path, **overrides) -> TrainingEngineConfig:
    """float32 (exact comparisons), lr large enough that one step visibly moves the weights."""
    settings = {"model_path": str(model_dir), "dtype": "float32", "lr": 1e-3, "grad_clip": 1.0, "device": "cpu"}
    return TrainingEngineConfig(**(settings | overrides))


def batch_of(prompts: list[list[int]], responses: list[list[int]]) -> Batch:
    """A Batch of these prompt and response token ids (left- and right-padded with 0)."""
    from posttrain.engines.training.inputs import build_model_inputs, lengths_to_mask

    width_p, width_r = max(map(len, prompts)), max(map(len, responses))
    prompt_mask = lengths_to_mask(torch.tensor([len(p) for p in prompts]), width_p, left_padded=True)
    response_mask = lengths_to_mask(torch.tensor([len(r) for r in responses]), width_r, left_padded=False)
    prompt_ids = torch.tensor([[0] * (width_p - len(p)) + p for p in prompts])
    response_ids = torch.tensor([r + [0] * (width_r - len(r)) for r in responses])
    return Batch.from_dict(build_model_inputs(prompt_ids, prompt_mask, response_ids, response_mask))


def make_batch(batch_size: int, *, prompt_length: int = 8, response_length: int = 8, seed: int = 0,
               vocab: int = VOCAB) -> Batch:
    """Left-padded prompts and right-padded responses of random lengths, with PPO's tensors.

    Row 0 has a full prompt and a full response so no column is padding in every row.
    """
    generator = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(1, prompt_length + 1, (batch_size,), generator=generator)
    response_lengths = torch.randint(1, response_length + 1, (batch_size,), generator=generator)
    prompt_lengths[0], response_lengths[0] = prompt_length, response_length
    tensors = random_model_inputs(prompt_lengths, response_lengths, prompt_length, response_length,
                                  vocab_size=vocab, generator=generator)
    tensors[keys.ADVANTAGES] = torch.randn(batch_size, response_length, generator=generator)
    tensors[keys.OLD_LOGPROBS] = -torch.rand(batch_size, response_length, generator=generator) * 3 - 3
    tensors[keys.RETURNS] = torch.randn(batch_size, response_length, generator=generator)
    tensors[keys.VALUES] = torch.randn(batch_size, response_length, generator=generator)
    return Batch.from_dict(tensors)


def grouped_batch(groups: int, samples: int, *, prompt_length: int = 10, response_length: int = 12,
                  seed: int = 0, observation_holes: bool = False) -> Batch:
    """``groups`` prompts of random lengths, each ``samples`` times with its own random response.

    ``observation_holes``: a multi-turn batch, where a stretch inside each response is an observation
    (attention 1, RESPONSE_MASK 0)."""
    generator = torch.Generator().manual_seed(seed)
    size = groups * samples
    prompt_lengths = torch.randint(2, prompt_length + 1, (groups,), generator=generator).repeat_interleave(samples)
    response_lengths = torch.randint(1, response_length + 1, (size,), generator=generator)
    response_lengths[0] = response_length
    prompt_mask = lengths_to_mask(prompt_lengths, prompt_length, left_padded=True)
    attended = lengths_to_mask(response_lengths, response_length, left_padded=False)
    prompt_ids = torch.randint(3, 256, (groups, prompt_length), generator=generator).repeat_interleave(samples, 0) * prompt_mask
    response_ids = torch.randint(3, 256, (size, response_length), generator=generator) * attended
    tensors = build_model_inputs(prompt_ids, prompt_mask, response_ids, attended)
    loss_mask = attended.float()
    if observation_holes:
        loss_mask[:, 3:6] = 0.0
    tensors[keys.RESPONSE_MASK] = loss_mask
    tensors[keys.ADVANTAGES] = torch.randn(size, response_length, generator=generator)
    tensors[keys.OLD_LOGPROBS] = -torch.rand(size, response_length, generator=generator) * 3 - 3
    tensors[keys.RETURNS] = torch.randn(size, response_length, generator=generator)
    tensors[keys.VALUES] = torch.randn(size, response_length, generator=generator)
    return Batch.from_dict(tensors)


def with_zero_advantages(batch: Batch, rows: list[int]) -> Batch:
    """``batch`` with the advantage 0 at every token of ``rows`` (rows an update may leave out)."""
    advantages = batch[keys.ADVANTAGES].clone()
    advantages[rows] = 0.0
    return Batch(batch.tensors | {keys.ADVANTAGES: advantages}, batch.non_tensors, batch.meta)


def ppo_loss(outputs: ForwardOutputs, micro_batch: Batch, global_normalizer: Tensor) -> tuple[Tensor, dict]:
    """PPO's clipped surrogate under token-mean with the global normaliser, as an actor worker would."""
    result = ppo_policy_loss(
        outputs.logprobs, micro_batch[keys.OLD_LOGPROBS], micro_batch[keys.ADVANTAGES], micro_batch[keys.RESPONSE_MASK],
        loss_agg_mode="token-mean", global_normalizer=global_normalizer,
    )
    return result.loss, {"pg_clipfrac": result.clipfrac, "ppo_kl": result.ppo_kl}


def ppo_entropy_loss(outputs: ForwardOutputs, micro_batch: Batch, global_normalizer: Tensor) -> tuple[Tensor, dict]:
    """PPO minus 0.1 x entropy (token-mean), to exercise the entropy's gradient."""
    loss, metrics = ppo_loss(outputs, micro_batch, global_normalizer)
    bonus = aggregate_loss(outputs.entropy, micro_batch[keys.RESPONSE_MASK], global_normalizer=global_normalizer)
    return loss - 0.1 * bonus, metrics


def critic_loss(outputs: ForwardOutputs, micro_batch: Batch, global_normalizer: Tensor) -> tuple[Tensor, dict]:
    result = value_loss(outputs.values, micro_batch[keys.VALUES], micro_batch[keys.RETURNS],
                        micro_batch[keys.RESPONSE_MASK], clip_range=0.5, global_normalizer=global_normalizer)
    return result.loss, {"vf_clipfrac": result.clipfrac}


def parameters(engine) -> dict[str, Tensor]:
    """A copy of every weight under its HF name (merged, gathered)."""
    return {name: tensor.detach().clone().cpu() for name, tensor in engine.named_weights()}


def max_difference(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def packed_and_padded(model_dir: Path, batch: Batch, **overrides) -> dict[bool, tuple]:
    """For pack_sequences True and False: (logprobs, entropy, metrics of one update, weights after it),
    micro-batches of 4 samples, with ppo_entropy_loss."""
    results = {}
    for pack in (True, False):
        engine = TrainingEngine(engine_config(model_dir, pack_sequences=pack, **overrides))
        logprobs, entropy = engine.compute_logprobs(batch, with_entropy=True, micro_batch_size=4)
        metrics = trained(engine, batch, ppo_entropy_loss, micro_batch_size=4, with_entropy=True)
        results[pack] = (logprobs, entropy, metrics, parameters(engine))
    return results


@contextlib.contextmanager
def counting_fused_head() -> Iterator[list[int]]:
    """A list that gets one entry for each forward pass that takes the fused LM head (``head_logprobs``)."""
    calls: list[int] = []
    fused = modeling.head_logprobs

    def counting(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    modeling.head_logprobs = counting
    try:
        yield calls
    finally:
        modeling.head_logprobs = fused


def trained(engine, *args, **kwargs) -> dict[str, float]:
    """``engine.train_mini_batch(...)``'s metrics as the floats that are logged."""
    return values(engine.train_mini_batch(*args, **kwargs))
