"""Every Batch key the system uses, named once, with its shape.

B = samples in the batch (prompts × rollout.n), P = prompt length (left-padded),
T = response length (right-padded), L = P + T.  Masks are 1 for real tokens, 0 for padding; the
response mask is also 0 on tokens the policy did not generate (environment observations).

Users' own columns may use any other name; these are reserved.
"""

# ---- tensors ---------------------------------------------------------------------------------
PROMPT_IDS = "prompts"                      # (B, P) int64, left-padded prompt token ids
PROMPT_MASK = "prompt_attention_mask"       # (B, P) int64, 1 on real prompt tokens
RESPONSE_IDS = "responses"                  # (B, T) int64, right-padded response token ids
INPUT_IDS = "input_ids"                     # (B, L) int64, prompt followed by response
ATTENTION_MASK = "attention_mask"           # (B, L) int64, 1 on real tokens
POSITION_IDS = "position_ids"               # (B, L) int64, positions counting real tokens only
RESPONSE_MASK = "response_mask"             # (B, T) int64/float, 1 on tokens that carry loss
BEHAVIOUR_LOGPROBS = "rollout_log_probs"    # (B, T) float32, log π_behaviour(token) from the rollout engine
OLD_LOGPROBS = "old_log_probs"              # (B, T) float32, log π_old(token) from the training engine
REF_LOGPROBS = "ref_log_prob"               # (B, T) float32, log π_ref(token)
ENTROPY = "entropy"                         # (B, T) float32, entropy of the policy at each token
VALUES = "values"                           # (B, T) float32, critic value per token
TOKEN_SCORES = "token_level_scores"         # (B, T) float32, task score (placed on the last response token)
TOKEN_REWARDS = "token_level_rewards"       # (B, T) float32, scores after the in-reward KL penalty
ADVANTAGES = "advantages"                   # (B, T) float32
RETURNS = "returns"                         # (B, T) float32
GROUP_IDS = "group_ids"                     # (B,) int64, samples from the same prompt share an id
BASELINE_SCORES = "reward_baselines"        # (B,) float32, score of the prompt's greedy response (ReMax)
GUIDED = "guided"                           # (B,) bool, the response is the row's reference answer, not sampled (rollout/guidance.py)
# (B,) bool, a group dynamic sampling dropped, kept for the KL loss alone (algorithm.filter_groups.kl_groups): advantage 0
KL_ONLY = "kl_only"
LOGPROBS = "log_probs"                      # (B, T) float32, log π(token) of the current weights at temperature 1 (SFT loss)

# ---- non-tensors (numpy object arrays of length B) -------------------------------------------
UID = "uid"                                 # str, unique per prompt, shared by its n samples
# str, one per episode where an episode may give several samples (a program's prefix breaks,
# rollout/program.py): group statistics count each episode once (algos/advantages.py ``per_episode``)
EPISODE_IDS = "episode_ids"
DATA_SOURCE = "data_source"                 # str, picks the reward function
SOURCE = "source"                           # str, a mixture's source of the row (config/mixture.py); absent without a mixture
GROUND_TRUTH = "ground_truth"               # Any, the reference answer
RAW_PROMPT = "raw_prompt"                   # list[dict], chat messages before templating
EXTRA_INFO = "extra_info"                   # dict, per-sample extras from the dataset
FINISH_REASON = "finish_reason"             # str, "stop" | "length"
# one agent turn (PolicyWorker.generate_turn): the context so far in, the sampled turn out
TURN_CONTEXT_IDS = "turn_context_ids"       # list[int], prompt + response so far
TURN_REQUEST_KEYS = "turn_request_keys"     # str per context: its episode's key and turn ("<episode>:<turn>"); seeds its sampling
TURN_TOKEN_IDS = "turn_token_ids"           # list[int], the turn's tokens exactly as sampled
TURN_LOGPROBS = "turn_log_probs"            # list[float], their behaviour logprobs
# the Env-LLM worker (EnvLLMWorker.chat): a conversation in, the environment model's reply out
ENV_LLM_MESSAGES = "env_llm_messages"       # list[dict], chat messages to answer
ENV_LLM_REPLY = "env_llm_reply"             # str, the reply's text
ENV_LLM_PROMPT_TOKENS = "env_llm_prompt_tokens"          # int, tokens of the templated prompt (after fitting)
ENV_LLM_COMPLETION_TOKENS = "env_llm_completion_tokens"  # int, tokens of the reply
# validation episodes only (dumped by `posttrain eval --dump-episodes`)
TRANSCRIPT = "transcript"                   # list[dict], the episode as chat messages: prompt, agent turns, observations
EPISODE_STATS = "episode_stats"             # dict[str, float], turns, valid actions and the environment's counters

# ---- meta ------------------------------------------------------------------------------------
WEIGHT_VERSION = "weight_version"           # int, version of the weights that generated the batch
GROUP_COUNT = "group_count"                 # int, groups in a batch whose groups vary in samples (EPISODE_IDS, or KL_ONLY groups): the update makes
                                            # (groups / ppo_mini_batch_size) optimizer steps per epoch, whatever the samples
KL_GROUP_COUNT = "kl_group_count"           # int, of those the groups kept for the KL loss alone (KL_ONLY): no steps of their own
TURN_MAX_NEW_TOKENS = "turn_max_new_tokens" # int, token budget of one agent turn
ROW_OFFSET = "row_offset"                   # int, the first row's place in a whole sampled in pieces (validation's batches): added to the seed
TURN_STOP = "turn_stop"                     # tuple[str, ...], stop strings that end an agent turn
