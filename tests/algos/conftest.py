import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded generator, so every test draws the same numbers whatever runs before it."""
    torch.manual_seed(0)
    return torch.Generator().manual_seed(1234)
