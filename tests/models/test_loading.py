"""resolve_model / load_causal_lm / load_tokenizer: errors that say what to do, pad-token policy."""

import json

import pytest
import torch

from posttrain.models import (
    DEFAULT_MODEL,
    ensure_pad_token,
    load_causal_lm,
    load_tokenizer,
    parse_dtype,
    resolve_model,
    smollm2_tokenizer_dir,
)


def test_missing_path_names_path_and_fix(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError) as error:
        resolve_model(missing)
    message = str(error.value)
    assert str(missing) in message and DEFAULT_MODEL in message and "save_pretrained" in message


def test_directory_without_config_is_rejected(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_causal_lm(tmp_path)


def test_existing_model_directory_resolves_to_itself(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


def test_non_causal_lm_config_is_rejected(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(ValueError, match="model_type=.t5.*causal language model"):
        load_causal_lm(tmp_path)


def test_parse_dtype():
    assert parse_dtype("bf16") is torch.bfloat16
    assert parse_dtype("float32") is torch.float32
    assert parse_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="Unknown dtype 'float8'"):
        parse_dtype("float8")


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())


def test_smollm2_tokenizer_has_chat_template_and_eos(smollm2_tokenizer):
    assert smollm2_tokenizer.eos_token == "<|im_end|>"
    assert smollm2_tokenizer.pad_token == "<|im_end|>"
    text = smollm2_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_pad_falls_back_to_eos(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer.__class__.from_pretrained(smollm2_tokenizer_dir())
    tokenizer.pad_token = None
    ensure_pad_token(tokenizer)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 2


def test_dedicated_pad_only_when_embedding_has_room(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer.__class__.from_pretrained(smollm2_tokenizer_dir())
    tokenizer.pad_token = None
    tokenizer.eos_token = None
    with pytest.raises(ValueError, match="neither a pad nor an eos"):
        ensure_pad_token(tokenizer, vocab_size=len(tokenizer))
    ensure_pad_token(tokenizer, vocab_size=len(tokenizer) + 64)
    assert tokenizer.pad_token == "<|pad|>"
    assert tokenizer.pad_token_id == len(tokenizer) - 1


def test_load_tokenizer_of_tiny_model(tiny_llama_dir):
    tokenizer = load_tokenizer(tiny_llama_dir)
    assert tokenizer.pad_token_id is not None and tokenizer.chat_template


def test_a_model_directory_whose_tokenizer_cannot_be_read_is_one_line_exit_2(tmp_path, capsys):
    import shutil

    from posttrain.cli import main
    from posttrain.models import cached_tiny_model

    future = tmp_path / "future-model"
    shutil.copytree(cached_tiny_model("llama"), future)
    (future / "tokenizer.json").write_text("{not json")  # a tokenizer file this transformers cannot read
    assert main(["eval", f"actor_rollout_ref.model.path={future}"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"posttrain: {future}: cannot load its tokenizer and config (JSONDecodeError") and "Traceback" not in error
