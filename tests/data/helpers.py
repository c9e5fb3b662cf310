"""Writing small verl-format Parquet files with pyarrow, and reading any back, independently of posttrain.data.format."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def verl_row(index: int, content: str, *, data_source: str = "src", ground_truth: str = "1", split: str = "train") -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index},
    }


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def parquet_rows(path: Path) -> list[dict]:
    """A Parquet file's rows as dicts, as pyarrow reads them."""
    return pq.read_table(path).to_pylist()
