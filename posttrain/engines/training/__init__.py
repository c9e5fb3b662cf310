"""The training engine: a model, AdamW, an LR schedule, bf16 autocast, micro-batching and DDP/FSDP2.

| module          | what |
|-----------------|------|
| `engine`        | `TrainingEngine`: compute_logprobs / compute_values / train_mini_batch, weights, checkpoints |
| `config`        | `TrainingEngineConfig`, the engine's explicit settings |
| `modeling`      | building the policy (causal LM) or critic (value head), LoRA; the per-micro-batch forward |
| `micro_batches` | splitting by sample count or by a token budget, equal counts across ranks |
| `parallel`      | process-group facts, DDP and FSDP2 wrapping, all-reduce, gradient norm |
| `schedule`      | warmup + constant / cosine learning-rate schedules |
| `checkpoint`    | save / load of model, optimizer, scheduler, counters and RNG states |
| `weights`       | full named weights for the rollout engine; export to a plain HF directory |
| `inputs`        | building input_ids / attention_mask / position_ids from prompts and responses |
"""

from posttrain.engines.training.config import TrainingEngineConfig
from posttrain.engines.training.engine import LossFn, TrainingEngine
from posttrain.engines.training.inputs import build_model_inputs, lengths_to_mask, position_ids_from_mask
from posttrain.engines.training.modeling import ForwardOutputs
from posttrain.engines.training.schedule import LRMultiplier, make_lr_scheduler

__all__ = [
    "ForwardOutputs",
    "LRMultiplier",
    "LossFn",
    "TrainingEngine",
    "TrainingEngineConfig",
    "build_model_inputs",
    "lengths_to_mask",
    "make_lr_scheduler",
    "position_ids_from_mask",
]
