"""``make tokenize`` (``pipeline.stages.tokenize``): the stage on ingested splits: its manifest, its vocabulary learned
from train only, skipping unchanged work; the tokenizers themselves: tests/text/."""

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.config import load_config
from pipeline.stages import ingest, tokenize
from pipeline.stages.tokenize.outputs import load_split
from pipeline.text.conventions import UNK_ID
from pipeline.text.wordpiece import WordPieceTextTokenizer
from tests.conftest import PROJECT_ROOT, REAL_ARCHIVE, requires_real_archive


def test_stage_requires_ingest_output(smoke_config):
    with pytest.raises(FileNotFoundError, match="make ingest"):
        tokenize.run(smoke_config)


def test_stage_outputs_manifest_and_vocabulary_never_sees_test(smoke_config):
    ingest_dir = ingest.run(smoke_config)
    test = pd.read_parquet(ingest_dir / "test.parquet")
    test.loc[0, "text"] = "zyzzyva " * 3 + test.loc[0, "text"]  # a word only the test split contains
    test.to_parquet(ingest_dir / "test.parquet", index=False)

    out_dir = tokenize.run(smoke_config)
    manifest = json.loads((out_dir / "manifest.json").read_text())
    for key in ("vocabulary_size", "unknown_token_rate", "truncated_fraction", "token_length", "config_hash"):
        assert key in manifest
    assert set(manifest["unknown_token_rate"]) == {"train", "val", "test"}
    assert (out_dir / "token_lengths.png").stat().st_size > 1000
    encoder = WordPieceTextTokenizer.load(out_dir)
    assert not any("zyzzyva".startswith(tok) and len(tok) > 3 for tok in encoder.vocabulary)
    assert "z" not in encoder.vocabulary and "##z" not in encoder.vocabulary  # 'z' never occurs in train
    test_ids = np.load(out_dir / "test_ids.npy")
    assert test_ids[0][1] == UNK_ID
    assert manifest["unknown_token_rate"]["test"] > 0 == manifest["unknown_token_rate"]["train"]
    train_ids, train_labels = load_split(out_dir, "train")
    assert len(train_ids) == len(train_labels) == manifest["rows"]["train"]


def test_stage_skips_when_unchanged_and_reruns_on_change(smoke_config, capsys):
    ingest.run(smoke_config)
    out_dir = tokenize.run(smoke_config)
    capsys.readouterr()
    tokenize.run(smoke_config)
    assert "up to date" in capsys.readouterr().out
    longer = smoke_config.replace(tokenizer={"max_sequence_length": 48})
    tokenize.run(longer)
    assert "up to date" not in capsys.readouterr().out
    assert np.load(out_dir / "train_ids.npy").shape[1] == 48
    ingest.run(smoke_config.replace(data={"seed": 3}))
    tokenize.run(longer)
    assert "up to date" not in capsys.readouterr().out.splitlines()[-1]


@requires_real_archive
def test_real_archive_subsample(tmp_path):
    config = load_config(
        PROJECT_ROOT / "configs" / "default.yaml",
        [f"data.archive={REAL_ARCHIVE}", f"paths.data_dir={tmp_path / 'data'}", "tokenizer.vocabulary_size=2000"],
    )
    ingest_dir = ingest.run(config)
    for split, rows in (("train", 2000), ("val", 200), ("test", 500)):
        frame = pd.read_parquet(ingest_dir / f"{split}.parquet")
        frame.sample(rows, random_state=0).to_parquet(ingest_dir / f"{split}.parquet", index=False)
    out_dir = tokenize.run(config)
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert 1500 < manifest["vocabulary_size"] <= 2000
    assert manifest["unknown_token_rate"]["test"] < 0.01
    assert 0.2 < manifest["truncated_fraction"]["test"] < 0.6
