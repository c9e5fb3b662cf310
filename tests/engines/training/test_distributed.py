"""Two gloo ranks (DDP, and FSDP2 on CPU) against one process: the same update, logprobs and checkpoint.

One spawn of two processes serves every test here (see distributed.py for what each rank runs).
Tolerance: parameters to 1e-7 after one step (eps = 1, see test_training.py), metrics to 1e-5.
"""

import pytest
import torch
import torch.multiprocessing as mp

from posttrain.engines.training import TrainingEngine
from tests.engines.training import distributed
from tests.engines.training.helpers import engine_config, make_batch, max_difference, parameters, ppo_loss, trained

@pytest.fixture(scope="module")
def ranks(small_lm, small_lm_tied, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ranks")
    context = mp.start_processes(
        distributed.run_rank, args=(str(small_lm), str(small_lm_tied), str(out_dir)), nprocs=distributed.WORLD_SIZE,
        join=False, start_method="spawn",
    )
    while not context.join(timeout=300):
        pass
    return out_dir, [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(distributed.WORLD_SIZE)]


@pytest.fixture(scope="module")
def single_process_step(small_lm):
    """One rank, the whole mini-batch as two accumulated micro-batches of 4."""
    torch.set_num_threads(1)
    engine = TrainingEngine(engine_config(small_lm, **distributed.EXACT))
    metrics = trained(engine, make_batch(8, seed=1), ppo_loss, micro_batch_size=4)
    return metrics, parameters(engine)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_equal_one_rank_with_gradient_accumulation(ranks, single_process_step, strategy):
    _, results = ranks
    metrics, params = single_process_step
    for rank_result in results:
        assert max_difference(rank_result[strategy]["params"], params) < 1e-7
        for name in ("actor/loss", "actor/grad_norm", "actor/pg_clipfrac"):
            assert rank_result[strategy]["metrics"][name] == pytest.approx(metrics[name], rel=1e-5)


def test_fsdp2_takes_the_fused_head_and_reduces_its_gradient_with_tied_embeddings(ranks, small_lm_tied):
    # The head's weight is sharded outside the forward pass; the fused head reads it gathered, on
    # every micro-batch, and its gradient (the embeddings' too, tied) is reduced over the ranks.
    _, results = ranks
    torch.set_num_threads(1)
    engine = TrainingEngine(engine_config(small_lm_tied, **distributed.EXACT))
    metrics = trained(engine, make_batch(8, seed=1), ppo_loss, micro_batch_size=4)
    for rank_result in results:
        tied = rank_result["fsdp_tied"]
        assert tied["fused_head_calls"] == 4 // distributed.TIED_MICRO_BATCH
        assert max_difference(tied["params"], parameters(engine)) < 1e-7
        assert tied["metrics"]["actor/grad_norm"] == pytest.approx(metrics["actor/grad_norm"], rel=1e-5)


def test_fsdp_with_uneven_micro_batch_counts_equals_one_rank(ranks, single_process_step, small_lm):
    _, results = ranks
    assert [r["uneven"]["first"]["actor/micro_batches"] for r in results][0] > 1  # rank 0 ran padding micro-batches
    metrics, _ = single_process_step
    for name in ("actor/loss", "actor/grad_norm", "actor/pg_clipfrac"):
        assert results[0]["uneven"]["first"][name] == pytest.approx(metrics[name], rel=1e-5)
        assert results[1]["uneven"]["first"][name] == results[0]["uneven"]["first"][name]
    engine = TrainingEngine(engine_config(small_lm, warmup_steps=2, **distributed.EXACT))
    expected, _ = engine.compute_logprobs(make_batch(8, seed=1))
    gathered = torch.cat([r["uneven"]["logprobs"] for r in results])
    torch.testing.assert_close(gathered, expected, atol=2e-5, rtol=0)
    trained(engine, make_batch(8, seed=1), ppo_loss)
    trained(engine, make_batch(8, seed=2), ppo_loss)
    assert max_difference(parameters(engine), results[0]["uneven"]["params"]) < 1e-7


def test_an_fsdp_checkpoint_resumes_in_one_process(ranks, small_lm):
    out_dir, results = ranks
    engine = TrainingEngine(engine_config(small_lm, warmup_steps=2, **distributed.EXACT))
    engine.load_checkpoint(out_dir / "fsdp_checkpoint")
    metrics = trained(engine, make_batch(8, seed=2), ppo_loss)
    fsdp = results[0]["uneven"]
    assert metrics["actor/lr"] == fsdp["second"]["actor/lr"] == pytest.approx(1e-2)
    assert metrics["actor/grad_norm"] == pytest.approx(fsdp["second"]["actor/grad_norm"], rel=1e-5)
    assert max_difference(parameters(engine), fsdp["params"]) < 1e-7


def test_the_fsdp_export_holds_the_gathered_weights(ranks):
    from transformers import AutoModelForCausalLM

    out_dir, results = ranks
    exported = AutoModelForCausalLM.from_pretrained(out_dir / "fsdp_export", dtype=torch.float32)
    assert max_difference(dict(exported.state_dict()), results[0]["uneven"]["params"]) == 0
    assert max_difference(results[0]["uneven"]["params"], results[1]["uneven"]["params"]) == 0


def test_fsdp_with_a_rank_whose_rows_are_all_skipped_equals_one_rank_running_them(ranks, small_lm):
    # rank 0 runs padding micro-batches only, in step with rank 1's three; the update is the full one
    _, results = ranks
    engine = TrainingEngine(engine_config(small_lm, **distributed.EXACT))
    metrics = trained(engine, distributed.skipping_batch(), ppo_loss, micro_batch_size=1)
    assert [r["skipping"]["metrics"]["actor/rows_skipped"] for r in results] == [1.0, 0.25]
    assert [r["skipping"]["metrics"]["actor/micro_batches"] for r in results] == [3.0, 3.0]
    for rank_result in results:
        assert max_difference(rank_result["skipping"]["params"], parameters(engine)) < 1e-7
        for name in ("actor/loss", "actor/grad_norm"):
            assert rank_result["skipping"]["metrics"][name] == pytest.approx(metrics[name], rel=1e-5)
