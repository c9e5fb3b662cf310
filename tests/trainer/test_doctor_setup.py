"""What a doctor run decides before any worker starts: which cases it refuses, whether it needs an
Env-LLM worker, and when its built-in dataset must be written anew."""

import pytest

from posttrain.agents.doctor import QA, Case, doctor_instruction
from posttrain.config.loader import load_config, preset_path
from posttrain.data import make_row, write_rows
from posttrain.models import cached_tiny_model
from posttrain.trainer.data_setup import _dataset_sources
from posttrain.rollout.env_llm import needs_env_llm_worker


def doctor_config(*overrides):
    tiny = str(cached_tiny_model("llama"))
    return load_config([preset_path("doctor_grpo")], [f"actor_rollout_ref.model.path={tiny}", f"env.llm.model_path={tiny}",
                                                     "data.builtin_options.train_size=16", "data.builtin_options.val_size=4",
                                                     "data.builtin_options.sft_size=8", "data.builtin_options.sft_val_size=0",
                                                     *overrides])


def test_a_case_without_a_self_report_is_refused_before_workers_naming_it(tmp_path):
    from posttrain.trainer.setup import rollout_setup

    good = Case("good-1", "I have a cough.", "A cough.", "asthma", (), (QA("Do you wheeze?", "Yes."),))
    rows = [make_row("doctor", [{"role": "user", "content": doctor_instruction(good.self_report)}], good.ground_truth(),
                     "medical-consultation", good.extra_info())]
    broken = good.extra_info() | {"case_id": "broken-2", "self_report": ""}
    rows.append(make_row("doctor", rows[0]["prompt"], good.ground_truth(), "medical-consultation", broken))
    train = write_rows(rows * 2, tmp_path / "train.parquet")
    config = doctor_config(f"data.train_files=[{train}]", "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                           f"trainer.default_local_dir={tmp_path / 'run'}")
    with pytest.raises(ValueError, match="training prompt 1: case 'broken-2' has no self-report"):
        rollout_setup(config)


def test_sft_without_validation_episodes_starts_no_env_llm(tmp_path):
    from posttrain.trainer.sft import sft_parts

    sft = ["sft.train_batch_size=4", "sft.micro_batch_size_per_gpu=4", "sft.optim.warmup_steps=0", f"trainer.default_local_dir={tmp_path}"]
    assert needs_env_llm_worker(sft_parts(doctor_config(*sft)).config)
    assert not needs_env_llm_worker(sft_parts(doctor_config(*sft, "sft.val_rollout=false")).config)


def test_sft_first_line_says_when_its_epochs_cut_the_steps_asked_short(tmp_path):
    from posttrain.trainer.sft import sft_parts

    sft = ["sft.train_batch_size=4", "sft.micro_batch_size_per_gpu=4", "sft.optim.warmup_steps=0", f"trainer.default_local_dir={tmp_path}",
           "sft.val_rollout=false", "sft.total_epochs=1"]
    capped = sft_parts(doctor_config(*sft, "sft.total_training_steps=5"))  # 8 transcripts of 4: one epoch is 2 steps
    assert capped.total_steps == 2
    assert "2 steps (sft.total_training_steps=5, but 1 epoch(s) of the transcripts" in capped.headline
    assert "raise sft.total_epochs" in capped.headline
    assert "total_training_steps" not in sft_parts(doctor_config(*sft, "sft.total_training_steps=2")).headline  # as asked


def test_the_dataset_cache_key_follows_the_environment_code_and_input_files(tmp_path):
    cases = tmp_path / "cases.json"
    cases.write_text('[{"self_report": "I itch.", "diagnosis": "eczema"}]')
    before = _dataset_sources("doctor", {"source_file": str(cases)})
    cases.write_text('[{"self_report": "I itch.", "diagnosis": "hives"}]')
    assert _dataset_sources("doctor", {"source_file": str(cases)}) != before
    # the environments the experts play are part of it
    assert b"class DoctorEnv" in _dataset_sources("synthetic-doctor", {})
    # and the preparer's helpers beside it: BFCL's added rows are made in bfcl_added.py
    assert b"def masked(" in _dataset_sources("bfcl", {})
    # bfcl's outside_irrelevance rows are GSM8K's problems: its preparer and the vendored copy count too
    assert b"def vendored(" in _dataset_sources("bfcl", {}) and b"Natalia sold clips" in _dataset_sources("bfcl", {})
