"""A character tokenizer and hand-built response batches for reward-manager tests."""

import textwrap
from pathlib import Path

import torch

from posttrain import keys
from posttrain.protocol import Batch

END = 0  # the one special token: skipped when decoding with skip_special_tokens


class CharTokenizer:
    """Token id n decodes to chr(n), so a test can write responses as strings."""

    def batch_decode(self, sequences, skip_special_tokens=False):
        return ["".join(chr(t) for t in seq if not (skip_special_tokens and t == END)) for seq in sequences]


def ids(text: str, width: int, fill: int = END) -> list[int]:
    return [ord(c) for c in text] + [fill] * (width - len(text))


def response_batch(texts, masks, data_sources, ground_truths, extra_infos=None) -> Batch:
    """RESPONSE_IDS from ``texts`` (right-filled with END to the masks' width) and RESPONSE_MASK = ``masks``."""
    width = len(masks[0])
    non_tensors = {keys.DATA_SOURCE: data_sources, keys.GROUND_TRUTH: ground_truths}
    if extra_infos is not None:
        non_tensors[keys.EXTRA_INFO] = extra_infos
    return Batch.from_dict(
        {
            keys.RESPONSE_IDS: torch.tensor([ids(t, width) for t in texts]),
            keys.RESPONSE_MASK: torch.tensor(masks),
        },
        non_tensors,
    )


def write_module(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path
