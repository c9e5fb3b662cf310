"""Building the engines a worker owns from its config sections (the one place that maps config
fields onto engine settings)."""

from __future__ import annotations

from posttrain.config.schema import EnvLLMConfig, ModelConfig, OptimConfig, RolloutConfig
from posttrain.engines.rollout import GenerationParams, HFRolloutEngine, RolloutEngine, VLLMRolloutEngine
from posttrain.engines.training import TrainingEngine, TrainingEngineConfig
from posttrain.errors import InputError


def training_engine(
    model_path: str, model: ModelConfig, optim: OptimConfig, *, dtype: str, grad_clip: float, total_steps: int | None,
    value_head: bool = False, metric_prefix: str = "actor", device: str = "auto", seed: int = 0,
    attn_implementation: str = "auto", compile: bool = False,
) -> TrainingEngine:
    return TrainingEngine(training_engine_config(
        model_path, model, optim, dtype=dtype, grad_clip=grad_clip, total_steps=total_steps, value_head=value_head,
        metric_prefix=metric_prefix, device=device, seed=seed, attn_implementation=attn_implementation, compile=compile,
    ))


def training_engine_config(
    model_path: str, model: ModelConfig, optim: OptimConfig, *, dtype: str, grad_clip: float, total_steps: int | None,
    value_head: bool = False, metric_prefix: str = "actor", device: str = "auto", seed: int = 0,
    attn_implementation: str = "auto", compile: bool = False,
) -> TrainingEngineConfig:
    """The engine's settings from config sections; raises ``InvalidSettings`` naming engine fields
    (``cli/preflight.py`` maps them back to config keys with :data:`ENGINE_FIELD_KEYS`)."""
    return TrainingEngineConfig(
        model_path=model_path, value_head=value_head, dtype=dtype, lr=optim.lr, betas=tuple(optim.betas),
        weight_decay=optim.weight_decay, lr_scheduler=optim.lr_scheduler, warmup_steps=optim.warmup_steps,
        total_steps=total_steps, min_lr_ratio=optim.min_lr_ratio, grad_clip=grad_clip,
        gradient_checkpointing=model.enable_gradient_checkpointing, attn_implementation=attn_implementation,
        pack_sequences=model.use_remove_padding, share_prompt=model.share_prompt,
        compile=compile, lora_rank=model.lora_rank,
        lora_alpha=model.lora_alpha, lora_target_modules=model.target_modules, metric_prefix=metric_prefix,
        device=device, init_seed=seed,
    )


# Engine field -> its key under a trainer section (actor_rollout_ref.actor, critic, sft); ``model.*`` keys
# live in the section's model config and ``device`` under trainer.
ENGINE_FIELD_KEYS = {
    "lr": "optim.lr", "betas": "optim.betas", "weight_decay": "optim.weight_decay", "lr_scheduler": "optim.lr_scheduler",
    "warmup_steps": "optim.warmup_steps", "min_lr_ratio": "optim.min_lr_ratio", "total_steps": "optim.warmup_steps",
    "grad_clip": "grad_clip", "dtype": "dtype", "lora_rank": "model.lora_rank", "lora_alpha": "model.lora_alpha",
    "device": "trainer.device", "attn_implementation": "attn_implementation", "compile": "compile",
    "share_prompt": "model.share_prompt",
}


def rollout_engine(model_path: str, rollout: RolloutConfig, *, max_model_len: int, seed: int) -> RolloutEngine:
    return build_engine(
        rollout.name, model_path, max_model_len=max_model_len, seed=seed, dtype=rollout.dtype, enforce_eager=rollout.enforce_eager,
        gpu_memory_utilization=rollout.gpu_memory_utilization, cpu_kv_cache_gb=rollout.cpu_kv_cache_gb,
        setting="actor_rollout_ref.rollout.name",
    )


def env_llm_engine(model_path: str, config: EnvLLMConfig, *, seed: int) -> RolloutEngine:
    """The Env-LLM's engine: its own context length and memory share, never a policy's."""
    return build_engine(
        config.rollout, model_path, max_model_len=config.max_model_len, seed=seed, dtype=config.dtype, enforce_eager=True,
        gpu_memory_utilization=config.gpu_memory_utilization, cpu_kv_cache_gb=config.cpu_kv_cache_gb, setting="env.llm.rollout",
    )


def build_engine(
    name: str, model_path: str, *, max_model_len: int, seed: int, dtype: str, enforce_eager: bool, gpu_memory_utilization: float,
    cpu_kv_cache_gb: float, setting: str,
) -> RolloutEngine:
    """Engine ``name`` (vllm | hf) for ``model_path``; ``setting`` names the config key in the error."""
    if name == "vllm":
        return VLLMRolloutEngine(
            model_path, max_model_len=max_model_len, seed=seed, dtype=dtype, enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization, kv_cache_bytes=int(cpu_kv_cache_gb * 2**30),
        )
    if name == "hf":
        return HFRolloutEngine(model_path, dtype=dtype, max_model_len=max_model_len)
    raise InputError(f"{setting}={name!r}: use vllm or hf")


def env_llm_params(config: EnvLLMConfig, *, seed: int | None) -> GenerationParams:
    """How the Env-LLM samples its replies (greedy by default); no logprobs: nothing trains on them."""
    return GenerationParams(max_new_tokens=config.max_tokens, temperature=config.temperature, top_p=config.top_p, n=1,
                            seed=seed, logprobs=False)


def generation_params(rollout: RolloutConfig, max_new_tokens: int, *, validation: bool, seed: int | None) -> GenerationParams:
    """Sampling for training rollouts (one sample per row: rows are already repeated n times) or validation."""
    sampling = rollout.val_kwargs if validation else rollout
    return GenerationParams(
        max_new_tokens=max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
        top_k=None if sampling.top_k < 1 else sampling.top_k, n=1, seed=seed,
    )
