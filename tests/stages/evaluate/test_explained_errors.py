"""The page of the most confident errors: each word coloured by its contribution, escaped, in order."""

import re

import pandas as pd

from pipeline.model.explain import Explanation
from pipeline.stages.evaluate.explained_errors import errors_page, highlighted, write_errors_page
from tests.model.test_explain import lexical_classifier
from tests.test_lexical import reviews


def test_words_are_coloured_by_sign_and_share_of_the_largest_and_escaped():
    spans = highlighted((("<b>great</b>", 2.0), ("dull", -1.0), ("the", 0.0)))
    assert "&lt;b&gt;great&lt;/b&gt;" in spans and "<b>" not in spans
    assert re.findall(r"rgba\((\d+), (\d+), 0, ([\d.]+)\)", spans) == [
        ("0", "150", "1.00"),
        ("210", "0", "0.50"),
        ("210", "0", "0.00"),
    ]
    assert 'title="+2.000"' in spans and 'title="-1.000"' in spans


def test_the_page_shows_each_error_with_its_parts_words(tmp_path):
    classifier = lexical_classifier(tmp_path, reviews(200, 6), reviews(60, 7))
    test = pd.DataFrame(
        {"text": ["A superb wonderful film, truly superb.", "Dull and awful.", "unused"]}, index=[10, 11, 12]
    )
    errors = pd.DataFrame(
        {
            "label_name": ["negative", "positive"],
            "predicted_label": ["positive", "negative"],
            "confidence": [0.97, 0.91],
            "source_file": ["test/neg/1_2.txt", "test/pos/3_9.txt"],
        },
        index=[10, 11],
    )
    path = write_errors_page(classifier, "nbsvm <run>", test, errors, tmp_path / "page.html")
    page = path.read_text()
    assert page.count("<section>") == 2 and "nbsvm &lt;run&gt;" in page
    assert "1. labelled negative, predicted positive with confidence 0.970" in page
    first = page.split("<section>")[1]
    assert [w for w in re.findall(r">([^<]+)</span>", first)] == ["a", "superb", "wonderful", "film", "truly", "superb"]
    assert re.search(r"most: <code>\+(wonderful|superb), \+(wonderful|superb)", first)
    assert (
        write_errors_page(classifier, "t", test, errors.head(0), tmp_path / "none.html").read_text().count("No errors")
        == 1
    )


def test_a_page_for_two_parts_names_each_with_its_weight():
    explanation = Explanation({"good": 1.0}, 1.0, 0.0, (("good", 1.0),))
    page = errors_page(
        "fused",
        pd.DataFrame(
            {"label_name": ["negative"], "predicted_label": ["positive"], "confidence": [0.9], "source_file": ["f"]}
        ),
        ["good"],
        [("Transformer (weight 0.40)", [explanation]), ("NBSVM (weight 0.60)", [explanation])],
    )
    assert "<b>Transformer (weight 0.40)</b>" in page and "<b>NBSVM (weight 0.60)</b>" in page
