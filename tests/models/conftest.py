import pytest

from posttrain.models import cached_tiny_model


@pytest.fixture(scope="session")
def tiny_llama_dir():
    return cached_tiny_model("llama")
