import numpy as np
import pytest

from pipeline.runtime.batching import batch_width, bucketed_batches, padding_fraction


def test_every_example_exactly_once_per_epoch_with_its_label():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 257, 1003)
    labels = rng.integers(0, 3, 1003)
    for seed in (1, 2, None):
        batches = bucketed_batches(lengths, batch_size=32, seed=seed, window_batches=4)
        rows = np.concatenate(batches)
        assert sorted(rows.tolist()) == list(range(1003))
        assert all(len(b) <= 32 for b in batches)
        # a batch carries its rows' own labels: gathering by index keeps the pairing
        np.testing.assert_array_equal(np.concatenate([labels[b] for b in batches]), labels[rows])


def test_epochs_differ_but_each_seed_is_reproducible():
    lengths = np.arange(500) % 97 + 1
    first = bucketed_batches(lengths, 16, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(first, bucketed_batches(lengths, 16, seed=1)))
    assert not all(np.array_equal(a, b) for a, b in zip(first, bucketed_batches(lengths, 16, seed=2)))


def test_bucketing_cuts_padding_to_about_a_tenth():
    rng = np.random.default_rng(3)
    lengths = np.minimum(rng.lognormal(5.0, 0.6, 5000).astype(int) + 1, 256)  # a review-like spread
    fixed = padding_fraction(lengths, [np.arange(len(lengths))], multiple=256, limit=256)
    bucketed = padding_fraction(lengths, bucketed_batches(lengths, 64, seed=0), multiple=16, limit=256)
    assert fixed > 0.3
    assert bucketed < 0.10


def test_batch_width_rounds_up_and_caps():
    assert batch_width(1, 16, 256) == 16 and batch_width(17, 16, 256) == 32
    assert batch_width(250, 16, 256) == 256 and batch_width(300, 16, 256) == 256


def test_evaluation_order_is_sorted_and_stable():
    lengths = np.array([5, 1, 5, 3])
    assert [b.tolist() for b in bucketed_batches(lengths, 2, seed=None)] == [[1, 3], [0, 2]]
    with pytest.raises(ValueError, match="batch_size"):
        bucketed_batches(lengths, 0, seed=None)
