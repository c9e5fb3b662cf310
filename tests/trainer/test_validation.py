"""Episode rows and their summary (what `posttrain eval --dump-episodes --by KEY` writes and prints)."""

import numpy as np
import torch

from posttrain import keys
from posttrain.protocol import Batch
from posttrain.trainer.validation import episode_rows, summarize_rows


def _row(hops, success, searches, turns, valid):
    return {"extra_info": {"hops": hops}, "success": success, "reward": float(success), "messages": [],
            "stats": {"searches": searches, "num_turns": turns, "valid_actions": valid}}


def test_summary_by_hand():
    rows = [_row(1, True, 1, 2, 2), _row(1, False, 0, 1, 0), _row(2, True, 2, 3, 3), _row(2, False, 1, 2, 1)]
    table = summarize_rows(rows, by="hops")
    assert table["hops=1"]["accuracy"] == 0.5 and table["hops=2"]["searches"] == 1.5
    from posttrain.trainer.intervals import wilson

    assert (table["hops=1"]["accuracy_low"], table["hops=1"]["accuracy_high"]) == wilson(1, 2)
    assert table["all"]["episodes"] == 4 and table["all"]["searches"] == 1.0
    assert table["hops=1"]["valid_action_ratio"] == 2 / 3  # 2 valid of 3 turns
    assert table["all"]["valid_action_ratio"] == 6 / 8


def test_agent_rows_carry_the_transcript_and_single_turn_rows_the_decoded_response(tokenizer):
    response = tokenizer.encode("42", add_special_tokens=False)
    tensors = {
        keys.TOKEN_SCORES: torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
        keys.RESPONSE_IDS: torch.tensor([response[:1] + [0], response[:1] + [0]]),
        keys.ATTENTION_MASK: torch.tensor([[1, 1, 0], [1, 1, 0]]),
    }
    common = {keys.DATA_SOURCE: ["s", "s"], keys.EXTRA_INFO: [{"hops": np.int64(1)}, {}], keys.GROUND_TRUTH: [np.array(["a"]), "b"],
              keys.RAW_PROMPT: [[{"role": "user", "content": "q"}]] * 2}
    plain = episode_rows(Batch.from_dict(tensors, common), tokenizer)
    assert plain[0]["messages"][-1] == {"role": "assistant", "content": tokenizer.decode(response[:1])}
    assert plain[0]["success"] and not plain[1]["success"] and plain[0]["ground_truth"] == ["a"]
    agent = Batch.from_dict(tensors, common | {
        keys.TRANSCRIPT: [[{"role": "user", "content": "q"}, {"role": "assistant", "content": "<answer> a </answer>"}]] * 2,
        keys.EPISODE_STATS: [{"searches": 2.0}, {"searches": 0.0}], "reward_extra/acc": np.array([0.0, 1.0]),
    })
    rows = episode_rows(agent, tokenizer)
    assert rows[0]["messages"][1]["content"] == "<answer> a </answer>" and rows[0]["stats"] == {"searches": 2.0}
    assert [r["success"] for r in rows] == [False, True]  # reward_extra/acc decides, not the reward


def test_a_held_out_set_of_several_batches_whose_prompts_differ_in_length_is_validated_whole(tmp_path, tokenizer, capsys):
    """Each batch's prompts are padded to its own longest; the validation joins batches of different widths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from posttrain.data import PromptDataLoader, RLDataset
    from posttrain.rollout.batching import sequences_to_batch
    from posttrain.trainer.validation import Validator

    questions = ["short?", "a much longer question " * 20 + "?", "mid " * 5 + "?"]
    rows = [{"data_source": "s", "prompt": [{"role": "user", "content": q}], "reward_model": {"ground_truth": "x"}} for q in questions]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "val.parquet")
    loader = PromptDataLoader(RLDataset([tmp_path / "val.parquet"], tokenizer, max_prompt_length=1024), 1, tokenizer.pad_token_id,
                              shuffle=False, drop_last=False)

    offsets = []

    def rollout(roles, prompts, validate):  # one token answered, right for the longest question only
        offsets.append(prompts.meta[keys.ROW_OFFSET])
        ids = [row[mask.bool()].tolist() for row, mask in zip(prompts[keys.PROMPT_IDS], prompts[keys.PROMPT_MASK])]
        batch = sequences_to_batch(ids, [[7]] * len(ids), pad_token_id=tokenizer.pad_token_id, response_width=4)
        scores = torch.zeros(len(ids), 4)
        scores[:, 0] = float(len(ids[0]) > 100)
        return batch.union(Batch.from_dict({keys.TOKEN_SCORES: scores}, {k: prompts[k] for k in (keys.DATA_SOURCE, keys.UID)})), {}

    class Roles:
        def for_rollout(self):
            return None

    metrics = Validator(rollout, loader, 1, tokenizer, samples_in_report=1)(Roles())
    assert metrics["val/s/acc/mean@1"] == 1 / 3
    assert offsets == [0, 1, 2]  # each batch seeded from its first row's place, as one batch of all would be
    progress = [line.split(" in ")[0] for line in capsys.readouterr().err.splitlines() if line.startswith("validation: ")]
    assert progress == ["validation: 1/3 prompts", "validation: 2/3 prompts", "validation: 3/3 prompts"]


def test_a_long_validation_set_comes_in_batches_of_at_most_256_unless_the_config_says():
    from posttrain.config.schema import DataConfig
    from posttrain.trainer.data_setup import _validation

    def batches(size: int, **data) -> list[int]:
        loader, _ = _validation(DataConfig(**data), list(range(size)), type("Tokenizer", (), {"pad_token_id": 0})())
        return [len(indices) for indices in loader.sampler]

    assert batches(600) == [256, 256, 88]  # a progress line after each
    assert batches(100) == [100]
    assert batches(600, val_batch_size=600) == [600]


def test_a_generate_calls_seed_adds_the_row_offset_its_batch_carries():
    from posttrain.workers.sampling import Sampling

    worker = Sampling()
    worker.seed, worker.seed_step, worker.rank = 7, 2, 0
    plain = Batch.from_dict({keys.PROMPT_IDS: torch.ones(2, 1)})
    offset = Batch.from_dict({keys.PROMPT_IDS: torch.ones(2, 1)}, meta={keys.ROW_OFFSET: 512})
    assert worker._seed(offset) == worker._seed(plain) + 512 == 7 + 2000 + 512
