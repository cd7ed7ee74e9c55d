"""make short-reviews: the short reviews of every split, with their label names and splits, read back by ingest as a
table whose splits are kept."""

from __future__ import annotations

import pandas as pd
import pytest

from pipeline.core.errors import ConfigError, InputError


def test_keeps_the_short_reviews_of_every_split_with_their_names_and_splits():
    from lab.experiments.short_reviews import short_reviews

    splits = {
        "train": pd.DataFrame({"text": ["one two", "a b c d e", "good"], "label": [1, 0, 0]}),
        "val": pd.DataFrame({"text": ["x y z w v u", "fine"], "label": [0, 1]}),
        "test": pd.DataFrame({"text": ["bad  film\n", "long " * 9], "label": [0, 1]}),
    }
    table = short_reviews(splits, ["negative", "positive"], max_words=3)
    assert table.to_dict("records") == [
        {"text": "one two", "label": "positive", "split": "train"},
        {"text": "good", "label": "negative", "split": "train"},
        {"text": "fine", "label": "positive", "split": "val"},
        {"text": "bad  film\n", "label": "negative", "split": "test"},
    ]
    with pytest.raises(ConfigError, match="--max-words"):
        short_reviews(splits, ["negative", "positive"], max_words=0)


def test_the_table_is_what_ingest_reads_with_its_splits(prepared_config):
    from lab.experiments import short_reviews
    from pipeline.core.catalog import stage_dir
    from pipeline.stages import ingest
    from pipeline.stages.ingest.outputs import read_split

    path = short_reviews.run(prepared_config, max_words=60)
    table = pd.read_parquet(path)
    source = read_split(stage_dir(prepared_config, "ingest"), "test")
    assert (table["split"] == "test").sum() == (source["text"].str.split().str.len() <= 60).sum() > 0
    short = prepared_config.replace(
        data={
            "source": "table",
            "path": str(path),
            "split_column": "split",
            "archive": None,
            "unlabeled_archive": None,
        },
        paths={"data_dir": str(path.parent.parent / "short"), "reports_dir": str(path.parent.parent / "reports")},
    )
    ingest.run(short)
    for split in ("train", "val", "test"):
        ingested = read_split(stage_dir(short, "ingest"), split)
        assert sorted(ingested["text"]) == sorted(table.loc[table["split"] == split, "text"])
    with pytest.raises(InputError, match="every split needs some"):
        short_reviews.run(prepared_config, max_words=1)
