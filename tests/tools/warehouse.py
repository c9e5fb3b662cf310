"""A user's tool class, as docs/tools.md "Tool classes" describes one (it imports nothing from posttrain):
a warehouse whose stock each episode changes, for tests/tools/test_tool_classes.py."""

import os
import tempfile
import time
from typing import Literal


class Warehouse:
    """One episode's warehouse: reset stocks it from the row, the model's calls change it, reward() judges it."""

    def reset(self, stock: dict[str, int], scratch_dir: str, data_source: str, ground_truth: str) -> str:
        self.stock = dict(stock)
        self.target = int(ground_truth)  # the apples that should be left
        # a file the instance holds for its lifetime: close() removes it (the test checks that none is left)
        handle, self.ledger = tempfile.mkstemp(prefix=f"ledger-{os.getpid()}-", dir=scratch_dir)
        os.close(handle)
        return f"The {data_source} warehouse is open."

    def count(self, item: str) -> int:
        """How many of an item are in stock.

        Args:
            item: The item's name, e.g. apple.
        """
        return self.stock.get(item, 0)

    def ship(self, item: str, quantity: int = 1) -> str:
        """Ship items out of the warehouse.

        Args:
            item: The item's name.
            quantity: How many to ship.
        """
        if self.stock.get(item, 0) < quantity:
            raise ValueError(f"only {self.stock.get(item, 0)} {item} in stock")
        self.stock[item] -= quantity
        with open(self.ledger, "a") as ledger:
            ledger.write(f"{item} {quantity}\n")
        return f"shipped {quantity} {item}"

    def inspect_shelves(self, how: Literal["slowly", "recklessly"]) -> str:
        """Inspect every shelf.

        Args:
            how: slowly never finishes; recklessly brings the building down.
        """
        if how == "slowly":
            time.sleep(3600)
        os._exit(7)

    def reward(self, answer: str | None) -> dict:
        """1 when the apples left are the row's ground truth, +0.5 when the final answer says how many are left."""
        left = self.stock.get("apple", 0)
        said = answer is not None and answer.strip() == str(left)
        return {"score": float(left == self.target) + 0.5 * said, "acc": left == self.target}

    def close(self) -> None:
        os.remove(self.ledger)
