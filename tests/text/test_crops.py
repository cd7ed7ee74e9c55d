import numpy as np
import pandas as pd
import pytest

from pipeline.text import crops

REVIEWS = pd.DataFrame(
    {
        "source_file": [f"r{i}.txt" for i in range(6)],
        "text": [
            "A fine film. The cast is great! Would I watch it again? Yes.",
            "One long sentence without an end",
            "Dull.\nToo long.\n\nI left early.",
            "Loved it. Hated the ending.",
            "It was okay... not more. Not less.",
            "Brilliant!",
        ],
        "label": [1, 0, 0, 1, 0, 1],
    }
)


def test_sentences_split_after_end_marks_and_at_line_breaks():
    assert crops.sentences("A fine film. The cast is great! Would I? Yes.") == [
        "A fine film.",
        "The cast is great!",
        "Would I?",
        "Yes.",
    ]
    assert crops.sentences("Dull.\nToo long\n\nI left early.") == ["Dull.", "Too long", "I left early."]
    assert crops.sentences("no end mark at all") == ["no end mark at all"]
    assert crops.sentences("   ") == []


def test_a_crop_is_one_or_two_consecutive_sentences_of_its_own_review_with_its_label():
    result = crops.sentence_crops(REVIEWS, seed=3, per_review=20)
    assert len(result) == 20 * len(REVIEWS)
    assert result["review"].tolist() == np.repeat(np.arange(len(REVIEWS)), 20).tolist()
    for row in result.itertuples():
        review = REVIEWS.iloc[row.review]
        pieces = crops.sentences(review.text)
        runs = {" ".join(pieces[i : i + n]) for n in (1, 2) for i in range(len(pieces) - n + 1)}
        assert row.text in runs
        assert (row.label, row.source_file) == (review.label, review.source_file)
    lengths = {len(crops.sentences(text)) for text in result["text"]}
    assert lengths == {1, 2}  # both lengths drawn (20 draws per review)


def test_crops_are_seeded():
    first, again = crops.sentence_crops(REVIEWS, seed=11), crops.sentence_crops(REVIEWS, seed=11)
    pd.testing.assert_frame_equal(first, again)
    others = [crops.sentence_crops(REVIEWS, seed=seed)["text"].tolist() for seed in range(12, 20)]
    assert any(texts != first["text"].tolist() for texts in others)


def test_crop_set_keeps_each_split_to_its_own_reviews_and_does_not_depend_on_the_other():
    val, test = REVIEWS.iloc[:3].reset_index(drop=True), REVIEWS.iloc[3:].reset_index(drop=True)
    built = crops.crop_set({"val": val, "test": test}, seed=5)
    assert set(built) == set(crops.CROP_SPLITS)
    assert set(built["val"]["source_file"]) <= set(val["source_file"])
    assert set(built["test"]["source_file"]) <= set(test["source_file"])
    assert not set(built["val"]["source_file"]) & set(built["test"]["source_file"])
    bigger_test = pd.concat([test, REVIEWS.iloc[:2]], ignore_index=True)
    pd.testing.assert_frame_equal(crops.crop_set({"val": val, "test": bigger_test}, seed=5)["val"], built["val"])


def test_word_buckets_have_inclusive_upper_bounds():
    assert crops.word_bucket_names() == ["<=25", "26-80", "81-250", ">250"]
    counts = np.array([1, 25, 26, 80, 81, 250, 251, 5000])
    assert crops.word_buckets(counts).tolist() == ["<=25", "<=25", "26-80", "26-80", "81-250", "81-250", ">250", ">250"]
    assert crops.word_counts(["two words", "  spaced   out  text ", ""]).tolist() == [2, 3, 0]


def test_per_review_must_be_positive():
    with pytest.raises(ValueError, match="per_review"):
        crops.sentence_crops(REVIEWS, seed=0, per_review=0)
