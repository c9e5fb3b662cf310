"""The typed config tree. Key names follow verl's where the concept is the same.

Batch sizes follow verl's units: ``data.train_batch_size`` and ``*.ppo_mini_batch_size`` count
prompts (each becomes ``rollout.n`` samples); ``*micro_batch_size_per_gpu`` counts samples on one
rank ("gpu" kept for verl users: on CPU it means one worker process).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class CurriculumConfig:
    # a column of each training row that names its difficulty level (extra_info.level): batches hold the
    # current level's rows; null: no curriculum (posttrain/data/sampler.py)
    key: Optional[str] = None
    levels: list[Any] = field(default_factory=list)  # the levels in order; empty: the rows' values, sorted
    threshold: float = 0.8  # step up when the current level's training accuracy over the window reaches this
    window: int = 4         # trainer steps whose samples that accuracy averages


@dataclass
class SamplerConfig:
    # a column (data_source, extra_info.<field>) whose values are strata: every batch holds each stratum
    # by its share; null: one stratum (posttrain/data/sampler.py)
    stratify_by: Optional[str] = None
    shares: dict[str, float] = field(default_factory=dict)  # stratum -> share of a batch; the rest by their rows
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    # A built-in dataset (`posttrain prepare NAME`) to write once into the cache and use when
    # train_files is empty: its train split for training, its test split for validation.
    builtin: Optional[str] = None
    builtin_options: dict[str, Any] = field(default_factory=dict)
    prompt_key: str = "prompt"
    max_prompt_length: int = 256
    max_response_length: int = 128
    train_batch_size: int = 8
    val_batch_size: Optional[int] = None
    truncation: str = "error"  # error | left | right
    filter_overlong_prompts: bool = True
    shuffle: bool = True
    seed: int = 42
    sampler: SamplerConfig = field(default_factory=SamplerConfig)  # strata, shares, a curriculum (training rows)
    # rows of the training files held back (a draw seeded by data.seed) as the validation set, in place of
    # val_files: settings are chosen on them, never on the held-out rows; `posttrain eval` evaluates them too
    dev_size: int = 0
    # files validated on beside the dev_size rows (a bare name: another split of the built-in dataset, e.g. BFCL's
    # dev_swapped.parquet); development rows of a kind the training files lack
    dev_files: list[str] = field(default_factory=list)


@dataclass
class ModelConfig:
    path: str = "smollm2-135m-instruct"
    enable_gradient_checkpointing: bool = False
    use_remove_padding: bool = True  # pack each sample's real tokens, several to a row, instead of padding (same results)
    # with packing: samples that share a prompt run it once, their responses after it (exact; docs/performance.md)
    share_prompt: bool = True
    lora_rank: int = 0  # 0 = full fine-tuning
    lora_alpha: int = 16
    target_modules: str = "all-linear"


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    lr_scheduler: str = "constant"  # constant | cosine
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0


@dataclass
class ActorConfig:
    ppo_mini_batch_size: int = 8
    ppo_micro_batch_size_per_gpu: int = 4
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 4096
    ppo_epochs: int = 1
    shuffle: bool = True
    policy_loss: str = "vanilla"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: Optional[int] = None  # seq-mean-token-sum-norm only; null: sum / (N * max_response_length), K: verl's sum / K
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    # the first N tokens of each response take no policy-gradient loss (the KL loss and the entropy bonus still
    # count them): 1 leaves a tool-calling warm-up's call/no-call decision (the first token) to the warm-up, so RL
    # trains what is called and how, not whether (docs/bfcl_runs.md, "The decision left to the warm-up")
    policy_loss_skip_first: int = 0
    # with use_kl_loss: 0 puts the KL loss on every response token; N on each response's first N tokens only (the
    # same per-token weight, the rest free of it): 1 anchors a tool-calling warm-up's call/no-call decision and
    # leaves what is called and how to the policy loss (docs/bfcl_runs.md, "The KL loss on the first token only")
    kl_loss_first_tokens: int = 0
    # with use_kl_loss: the KL loss counts each response's first token this many times a later token (1: alike). At the
    # same coefficient the first token's pull is one token's in a whole answer's; a weight of about the answer's length
    # pulls a tool-calling warm-up's call/no-call decision back as firmly as the whole answer. It acts on the rows the
    # update sees: under dynamic sampling only the groups whose answers differ, so BFCL's no-call rows answered rightly
    # were never held, and the decision still drifted (docs/bfcl_runs.md, "The first token's KL weighted")
    kl_loss_first_token_weight: float = 1.0
    grad_clip: Optional[float] = 1.0  # max gradient norm; null: measured, never clipped
    dtype: str = "auto"  # autocast dtype: auto (bfloat16 where native: CUDA, AVX-512 BF16/AMX CPUs; else float32) | bfloat16 | float32
    attn_implementation: str = "auto"  # auto (sdpa on CUDA, eager on CPU: 1.3x faster update there) | eager | sdpa
    compile: bool = False  # torch.compile each decoder layer: 1.09-1.29x faster CPU updates after 1-2 min compiling
    # rows whose advantage is 0 at every token (GRPO: groups that all scored the same) are not run: their
    # loss and gradient are exactly 0 (not with entropy_coeff or use_kl_loss, where they are run anyway)
    skip_zero_advantage: bool = True
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass
class ValidationSampling:
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1


@dataclass
class RolloutConfig:
    name: str = "vllm"  # vllm | hf
    n: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    dtype: str = "auto"  # the engine's weights: auto (bfloat16 where native, as actor.dtype) | bfloat16 | float32
    gpu_memory_utilization: float = 0.5
    cpu_kv_cache_gb: float = 2.0
    enforce_eager: bool = True
    log_prob_micro_batch_size_per_gpu: int = 8
    val_kwargs: ValidationSampling = field(default_factory=ValidationSampling)


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = 8


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)


@dataclass
class CriticConfig:
    enable: Optional[bool] = None  # None: on exactly when the advantage estimator needs values (gae)
    model_path: Optional[str] = None  # None: the policy's model
    ppo_mini_batch_size: int = 8
    ppo_micro_batch_size_per_gpu: int = 4
    ppo_epochs: int = 1
    cliprange_value: float = 0.5
    grad_clip: Optional[float] = 1.0  # null: measured, never clipped
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))


@dataclass
class OverlongBufferConfig:
    """DAPO's overlong reward shaping: a response whose length reaches into the last ``len`` tokens
    before data.max_response_length loses reward linearly, ``penalty_factor`` at the limit."""

    enable: bool = False
    len: int = 0  # the buffer, in tokens
    penalty_factor: float = 1.0


@dataclass
class RewardModelConfig:
    reward_manager: str = "naive"  # naive: one score call per sample | batch: one call with lists
    enable: bool = False
    model_path: Optional[str] = None
    micro_batch_size_per_gpu: int = 8
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)  # verl's key, applied to every reward


@dataclass
class CustomRewardConfig:
    path: Optional[str] = None
    name: str = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 10.0
    step_timeout_s: Optional[float] = 600.0  # all of a step's scoring (a generator's unit, async); samples left score 0 as timeouts; null: no limit
    stop_at_failed_fraction: Optional[float] = 1.0  # stop the run when this fraction of a step's rewards error or time out (1.0: all); null: never


@dataclass
class JudgeConfig:
    """The judge of ``reward.rubric``'s judge parts: the environment's model, ``env.llm`` (the Env-LLM worker,
    started for it, or the server at ``env.llm.url``), asked through its client (posttrain/rewards/judge.py)."""

    timeout_s: Optional[float] = 300.0  # one batched request's deadline; its replies fail past it; null: none
    # the judge's replies by (model, sampling, rendered prompt), for the run and its resume: auto is
    # judge_cache.sqlite in trainer.default_local_dir; a path; null: none
    cache: Optional[str] = "auto"
    # before training, each judge part with a rule is asked about right answers (the rows' own) and wrong ones
    # (another row's) that the rule decides: a judge agreeing on less than this share refuses to start; null: no check
    min_agreement: Optional[float] = 0.8
    agreement_rows: int = 32  # held-out rows (else training rows) of that check
    stop_at_failed_fraction: Optional[float] = 1.0  # stop the run when this fraction of a step's judge replies fail; null: never


@dataclass
class RewardConfig:
    # a reward made of named, weighted parts, each a rule or a judge: [{name, weight, rule | judge}], rule a data
    # source, a rule of posttrain's (bfcl_arguments, bfcl_parameters[_per_call], bfcl_decline) or FILE.py:FUNCTION, judge
    # {prompt, parser, ...} (posttrain/rewards/rubric.py, judge.py); it scores every sample in place of the data
    # source's function
    rubric: list[Any] = field(default_factory=list)
    judge: JudgeConfig = field(default_factory=JudgeConfig)


@dataclass
class KLControlConfig:
    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling: groups whose rewards are all equal (no learning signal under group
    advantages) are dropped and more prompts generated until the batch is full again."""

    enable: bool = False
    max_num_gen_batches: int = 10  # generation rounds per step at most; then the step trains the groups it kept
    # groups without reward spread kept anyway, after the batch's, at advantage 0 (marked kl_only): the KL loss (and an entropy
    # bonus) still counts them, so what the policy already answers alike in every sample is held to the reference; the
    # best-scored first (all answers right before all wrong), earlier rounds first among equals; no optimizer steps of their own.
    # The config check says what it needs (algorithm_checks.check_kl_groups); the update's token mean counts their tokens too
    kl_groups: int = 0


@dataclass
class GuidanceConfig:
    """Off-policy guidance from the data (rollout/guidance.py): in training, a group none of whose answers is
    right gets its row's ``extra_info.reference_answer`` as its last sample, scored like any answer."""

    enable: bool = False


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    guidance: GuidanceConfig = field(default_factory=GuidanceConfig)


@dataclass
class RetrieverConfig:
    url: Optional[str] = None  # a running service (`posttrain serve-retriever`); None: start one for the run
    token_env: Optional[str] = "POSTTRAIN_RETRIEVER_TOKEN"  # the environment variable holding the service's token, sent as `Authorization: Bearer` (unset or empty: none sent)
    corpus: Optional[str] = None  # JSON lines {"id", "contents"}; None: the built-in dataset's corpus.jsonl
    index: str = "bm25"  # bm25 | dense
    port: Optional[int] = None  # for a service the trainer starts; None: any free port
    timeout_s: float = 30.0
    retries: int = 2
    startup_timeout_s: float = 600.0
    stop_at_failed_fraction: Optional[float] = 1.0  # stop the run when this fraction of a step's searches fail (1.0: all); null: never


@dataclass
class EnvLLMConfig:
    """The environment's language model (a patient, a simulated user, a judge): the Env-LLM worker
    serving ``model_path`` in the cluster, or an OpenAI-compatible chat server at ``url``. It is
    started only when the environment asks for it (``env_llm``) and never receives policy weights."""

    model_path: str = "smollm2-135m-instruct"  # a built-in name or a local HF directory
    url: Optional[str] = None  # an OpenAI-compatible server (e.g. `vllm serve`); None: the in-cluster worker
    api_model: Optional[str] = None  # the model name sent to the server; None: model_path
    api_key_env: Optional[str] = "OPENAI_API_KEY"  # the environment variable holding the server's key (unset: none sent)
    rollout: str = "vllm"  # vllm | hf: the engine of the in-cluster worker
    dtype: str = "auto"  # its weights: auto (bfloat16 where native) | bfloat16 | float32
    placement: str = "colocate"  # colocate (in the policy's processes) | separate (its own pool)
    cpus: int = 1  # CPUs of its own pool (placement=separate)
    gpus: float = 1.0  # GPUs of its own pool on a GPU machine (placement=separate)
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    max_tokens: int = 48  # new tokens per reply
    max_model_len: int = 1024  # prompt + reply tokens; older dialogue turns are dropped to fit
    cpu_kv_cache_gb: float = 1.0
    gpu_memory_utilization: float = 0.2
    timeout_s: float = 60.0  # per HTTP request (url)
    retries: int = 2  # per conversation, for a server at url (the in-cluster worker is part of the run: it fails it)
    stop_at_failed_fraction: Optional[float] = 1.0  # stop the run when this fraction of a step's replies fail (1.0: all); null: never
    # the doctor's LLM patient, asked its held-out cases' yes/no findings before RL: a run whose patient
    # agrees on less than this share refuses to start (a patient that answers at random teaches nothing); null: no probe
    min_faithfulness: Optional[float] = 0.8
    # a SQLite file of replies by (model, sampling, conversation): a conversation asked before gets its stored
    # reply, so an evaluation replays exactly (agents/env_llm.py ReplyCache); null: every reply generated
    reply_cache: Optional[str] = None


@dataclass
class EnvConfig:
    """Multi-turn agents. ``name: null`` trains single-turn (one response per prompt, reward manager)."""

    name: Optional[str] = None  # a built-in (search) or your own name with path + class_name
    path: Optional[str] = None  # your environment's .py file or module
    class_name: Optional[str] = None
    options: dict[str, Any] = field(default_factory=dict)  # keyword arguments of the environment class
    max_turns: int = 4  # ordinary turns; an episode still going after them gets one final turn that must answer; -1: drawn per episode from 2 to 10
    turns_range: list[int] = field(default_factory=list)  # [low, high]: draw max_turns per episode instead
    max_turn_tokens: int = 128  # new tokens per agent turn
    max_obs_length: int = 256  # tokens of one observation turn
    observation_role: str = "user"  # user | tool: the chat role observations are rendered with
    reward_norm: str = "none"  # none | group | batch: normalise episode rewards (single-turn rows' too) before advantages
    filter_groups_quantile: float = 0.0  # drop groups whose in-group reward std is below this quantile (0: keep all)
    # tool-calling agents (env.name: tools; docs/tools.md)
    tools: list[Any] = field(default_factory=list)  # FILE.py:FUNCTION, FILE.py:CLASS (docs/tools.md "Tool classes"), module:FUNCTION, or {schemas: FILE.json, module: FILE.py}
    mcp_servers: list[Any] = field(default_factory=list)  # [{command: [program, arg, ...], env: {...}}]: MCP servers over stdio
    tool_format: str = "auto"  # how tools are told, calls written, results returned (models/tool_formats/: builtin, template, jsonl); auto: template if the chat template renders tools, else builtin
    tool_parser: str = "auto"  # the builtin and template formats: a vLLM tool parser (hermes, llama3_json, pythonic, ...); auto: from the chat template
    tool_timeout_s: float = 10.0  # seconds one call may run
    max_tool_calls: int = 8  # calls per episode; later ones are answered with an over_budget error
    tool_output_chars: int = 20000  # characters of one result kept before the observation is cut to max_obs_length tokens
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    llm: EnvLLMConfig = field(default_factory=EnvLLMConfig)


@dataclass
class SFTConfig:
    """Supervised fine-tuning (``posttrain sft``): the policy learns the assistant turns of transcripts.

    The model is ``actor_rollout_ref.model``; run directory, trackers and checkpoints are ``trainer.*``;
    the validation rollout (the RL task's reward on ``data.val_files`` / ``data.builtin``, in ``env.*``
    when set) runs before and after training when ``val_rollout`` is on.
    """

    train_files: list[str] = field(default_factory=list)  # empty: the sft.parquet beside the RL training data
    val_files: list[str] = field(default_factory=list)  # validation loss; with train_files empty too: sft_val.parquet beside the RL data, if any
    messages_key: str = "messages"
    max_length: int = 1024  # prompt + response tokens of one transcript
    truncation: str = "drop"  # error | drop | left (cut the prompt's start)
    require_success: bool = False  # keep only rows whose `success` is true (a dump of the policy's own episodes)
    train_batch_size: int = 16  # transcripts per optimizer step
    micro_batch_size_per_gpu: int = 8
    total_epochs: int = 2
    total_training_steps: Optional[int] = None  # None: the epochs decide
    grad_clip: Optional[float] = 1.0  # null: measured, never clipped
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5, lr_scheduler="cosine", warmup_steps=5, min_lr_ratio=0.1))
    test_freq: int = -1  # validation loss every N steps (and always at the start and end)
    val_rollout: bool = True  # the RL task's validation (reward, accuracy) before and after; needs validation prompts
    seed: int = 42


@dataclass
class AsyncConfig:
    """Asynchronous training (``trainer.mode=async``; written ``async.*`` on the command line and in
    YAML): generator actors produce groups with the newest published weights while the trainer
    updates; a sample is trained at most ``max_staleness`` versions after the weights that sampled it."""

    num_generators: int = 1
    max_staleness: int = 1  # 0: synchronous behaviour; 1: one-step off-policy; k: up to k versions behind
    buffer_size: Optional[int] = None  # groups generated but not yet trained; None: (max_staleness + 1) batches
    unit_groups: Optional[int] = None  # groups per generator call; None: a batch's groups split over the generators
    partial_rollout: str = "finish"  # finish: an episode ends with the weights it began with | resume: newer weights between turns
    # decoupled: the loss is clipped around the proximal policy (the trainer's logprobs before the update)
    # and weighted by proximal / behaviour, truncated at importance_cap (truncated IS) | none: no weight
    correction: str = "decoupled"
    importance_cap: float = 2.0
    # how new weights reach the generators: object_store (one shared object per version, pulled) |
    # collective (a broadcast group of the trainer and the generators: NCCL on GPUs) | auto (collective on GPUs)
    weight_transport: str = "auto"
    generator_cpus: float = 0.5  # CPUs of each generator's process; a fraction shares a core with the trainer (it rounds its threads up)
    generator_gpus: float = 1.0  # GPUs of each generator on a GPU machine


@dataclass
class TrainerConfig:
    mode: str = "sync"  # sync: generate then train on the same workers | async: generators beside a trainer (async.*)
    project_name: str = "posttrain"
    experiment_name: str = "run"
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    nnodes: int = 1
    n_workers_per_node: int = 1  # ranks per node: GPUs on a GPU node, worker processes on CPU
    cpus_per_worker: Optional[int] = None  # None: this machine's CPUs split evenly over its workers
    device: str = "auto"  # auto | cpu | cuda
    total_epochs: int = 1
    total_training_steps: Optional[int] = None
    critic_warmup: int = 0
    test_freq: int = -1
    save_freq: int = -1
    val_before_train: bool = True
    val_samples_in_report: int = 4
    # each training step's scored samples (the rows of validation/step_N.jsonl, with response_tokens, uid and
    # advantage) to <dir>/step_N.jsonl; a relative path is under the run directory; None: not written
    rollout_data_dir: Optional[str] = None
    default_local_dir: str = "runs/${trainer.project_name}/${trainer.experiment_name}"
    resume_mode: str = "auto"  # auto | disable | a checkpoint path
    max_ckpt_to_keep: Optional[int] = None
    ray_address: Optional[str] = None  # None: start a local Ray; "auto": join the running cluster
    ray_dashboard: bool = False  # start Ray's dashboard (a local Ray) and print its URL
    call_timeout_s: Optional[float] = 3600.0  # a worker call unanswered this long stops the run naming role, rank, method, step; None: no deadline
    stop_after_skipped_steps: int = 3  # stop the run after this many steps in a row with every update skipped (non-finite gradient); 0: never
    # when a worker, generator, retriever or Env-LLM process dies or a call passes its deadline: restart the
    # workers and go on from the last complete checkpoint, at most this many times; None: 2 with
    # trainer.save_freq >= 1, else 0 (0: stop with the error naming the checkpoint to resume from)
    max_restarts: Optional[int] = None
    seed: int = 1


@dataclass
class PosttrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardConfig = field(default_factory=CustomRewardConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    async_: AsyncConfig = field(default_factory=AsyncConfig)  # the key ``async`` (a Python keyword) in YAML and overrides
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # several datasets in one run, each with its environment and weight (config/mixture.py):
    # [{name, weight, data: {...}, env: {...}, reward: {...}, custom_reward_function: {...}}]
    mixture: list[Any] = field(default_factory=list)
