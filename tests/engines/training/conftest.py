import pytest
import torch

from tests.engines.training.helpers import make_small_lm


@pytest.fixture(scope="session")
def small_lm(tmp_path_factory):
    """A 2-layer llama with a 256-token vocabulary (no tokenizer), shared read-only by the tests."""
    return make_small_lm(tmp_path_factory.mktemp("small_lm"))


@pytest.fixture(scope="session")
def small_lm_tied(tmp_path_factory):
    return make_small_lm(tmp_path_factory.mktemp("small_lm_tied"), tie_word_embeddings=True)


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    # Tiny models on a shared 2-core machine: two intra-op threads spin against other processes and
    # run ~50x slower than one (measured: 1.0 s vs 0.02 s for one mini-batch).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)
