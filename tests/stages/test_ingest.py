import gzip
import io
import json
import shutil
import tarfile
import zlib
from pathlib import Path

import pandas as pd
import pytest

from pipeline.__main__ import main as cli_main
from pipeline.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.stages import ingest
from pipeline.stages.ingest import imdb
from pipeline.text.conventions import clean_text
from tests.conftest import (
    PROJECT_ROOT,
    REAL_ARCHIVE,
    add_member,
    make_archive,
    requires_real_archive,
    write_imdb_tree,
)


def read_splits(out_dir: Path) -> dict[str, pd.DataFrame]:
    return {name: pd.read_parquet(out_dir / f"{name}.parquet") for name in ("train", "val", "test")}


def test_clean_text_turns_breaks_into_newlines_and_normalises():
    decomposed = "Cafe\u0301"  # e + combining acute accent
    assert clean_text(f"  Good.<br /><br />{decomposed} <BR>x  ") == "Good.\n\nCaf\u00e9 \nx"


def test_decode_review_replaces_bad_bytes():
    text, bad = imdb.decode_review(b"ok \xff\xfe end")
    assert bad and "\ufffd" in text and text.startswith("ok")
    assert imdb.decode_review("fine é".encode()) == ("fine é", False)


@pytest.mark.parametrize(
    "name,expected",
    [("12_8.txt", (12, 8)), ("0_1.txt", (0, 1)), ("12-8.txt", None), ("x_8.txt", None), ("12_8.text", None)],
)
def test_parse_file_name(name, expected):
    assert imdb.parse_file_name(name) == expected


def test_ingest_writes_splits_labels_ratings_and_manifest(smoke_config):
    out_dir = ingest.run(smoke_config)
    splits = read_splits(out_dir)
    assert {n: len(s) for n, s in splits.items()} == {"train": 64, "val": 16, "test": 40}
    for split in splits.values():
        assert list(split.columns) == list(imdb.COLUMNS)
        pos = split[split["label"] == 1]
        neg = split[split["label"] == 0]
        assert pos["rating"].between(7, 10).all() and neg["rating"].between(1, 4).all()
        assert pos["source_file"].str.contains("/pos/").all() and neg["source_file"].str.contains("/neg/").all()
        assert not split["text"].str.contains("<br", case=False).any()
    # stratified: both classes equally represented in val
    assert splits["val"]["label"].value_counts().to_dict() == {0: 8, 1: 8}
    # val comes from train only; test is untouched
    assert splits["test"]["source_file"].str.startswith("test/").all()
    assert splits["val"]["source_file"].str.startswith("train/").all()
    assert not set(splits["train"]["source_file"]) & set(splits["val"]["source_file"])
    # <br /> became line breaks: review 0 of every class had them
    assert splits["test"]["text"].str.contains("\n").sum() == 8

    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["rows"] == {"train": 64, "val": 16, "test": 40}
    assert manifest["labels"]["test"] == {"negative": 20, "positive": 20}
    assert json.loads((out_dir / "labels.json").read_text()) == {"labels": ["negative", "positive"]}
    assert (splits["train"]["label_name"] == splits["train"]["label"].map({0: "negative", 1: "positive"})).all()
    assert len(manifest["archive_sha256"]) == 64
    assert manifest["config_hash"] == smoke_config.section_hash("data")
    assert set(manifest["duplicates"]) == {"within_train", "within_test", "test_rows_in_train"}
    assert manifest["length_words"]["train"]["p50"] > 0
    assert manifest["code_version"]


def test_split_is_deterministic_and_seeded(smoke_config, tmp_path):
    first = read_splits(ingest.run(smoke_config))
    again = read_splits(ingest.run(smoke_config, force=True))
    for name in first:
        pd.testing.assert_frame_equal(first[name], again[name])
    other_seed = smoke_config.replace(data={"seed": 99}, paths={"data_dir": str(tmp_path / "other")})
    reseeded = read_splits(ingest.run(other_seed))
    assert set(reseeded["val"]["source_file"]) != set(first["val"]["source_file"])


def test_folder_source_gives_same_splits_as_archive(smoke_config, tiny_imdb_dir, tmp_path):
    from_archive = read_splits(ingest.run(smoke_config))
    folder_config = smoke_config.replace(
        data={"archive": str(tiny_imdb_dir)}, paths={"data_dir": str(tmp_path / "from_folder")}
    )
    from_folder = read_splits(ingest.run(folder_config))
    for name in from_archive:
        pd.testing.assert_frame_equal(from_archive[name], from_folder[name])


def test_rerun_skips_when_unchanged_and_reruns_on_change(smoke_config, capsys):
    out_dir = ingest.run(smoke_config)
    before = (out_dir / "manifest.json").stat().st_mtime_ns
    capsys.readouterr()
    ingest.run(smoke_config)
    assert "up to date" in capsys.readouterr().out
    assert (out_dir / "manifest.json").stat().st_mtime_ns == before
    ingest.run(smoke_config.replace(data={"validation_fraction": 0.25}))
    assert "up to date" not in capsys.readouterr().out
    assert json.loads((out_dir / "manifest.json").read_text())["rows"]["val"] == 20


def test_environment_variable_selects_archive(tiny_imdb_archive, tmp_path, monkeypatch):
    monkeypatch.setenv("IMDB_ARCHIVE", str(tiny_imdb_archive))
    config = load_config(None, [f"paths.data_dir={tmp_path / 'data'}"])
    assert imdb.resolve_source(config.data, config.data_dir) == tiny_imdb_archive


def test_download_verifies_md5_and_renames(tiny_imdb_archive, tmp_path):
    url = tiny_imdb_archive.as_uri()
    md5 = imdb.md5_file(tiny_imdb_archive)
    config = load_config(
        None, [f"paths.data_dir={tmp_path / 'data'}", f"data.download_url={url}", f"data.download_md5={md5}"]
    )
    source = imdb.resolve_source(config.data, config.data_dir)
    assert source == tmp_path / "data" / "raw" / imdb.CANONICAL_ARCHIVE_NAME
    assert imdb.md5_file(source) == md5
    assert not list(source.parent.glob("*.part"))


def test_download_with_wrong_md5_keeps_nothing(tiny_imdb_archive, tmp_path):
    config = load_config(
        None,
        [
            f"paths.data_dir={tmp_path / 'data'}",
            f"data.download_url={tiny_imdb_archive.as_uri()}",
            "data.download_md5=0",
        ],
    )
    with pytest.raises(ValueError, match="expected 0"):
        imdb.resolve_source(config.data, config.data_dir)
    assert not list((tmp_path / "data" / "raw").iterdir())


def test_offline_error_names_the_environment_variable(tmp_path):
    config = load_config(
        None, [f"paths.data_dir={tmp_path / 'data'}", "data.download_url=http://127.0.0.1:9/aclImdb_v1.tar.gz"]
    )
    with pytest.raises(PipelineError, match="IMDB_ARCHIVE"):
        imdb.resolve_source(config.data, config.data_dir)


def test_an_up_to_date_ingestion_needs_no_archive_again_and_a_stale_one_names_the_one_it_read(
    tiny_imdb_archive, tmp_path, monkeypatch, capsys
):
    """After ``make all IMDB_ARCHIVE=...``, the stages that re-check ingestion run without the variable (offline: no
    download is tried); when the config changed and the archive is needed, the error names the path it read."""
    settings = [
        f"paths.data_dir={tmp_path / 'data'}",
        "data.download_url=http://127.0.0.1:9/aclImdb_v1.tar.gz",
        "data.validation_fraction=0.2",
    ]
    monkeypatch.setenv("IMDB_ARCHIVE", str(tiny_imdb_archive))
    out_dir = ingest.run(load_config(PROJECT_ROOT / "configs" / "smoke.yaml", settings))
    written = {path.name: path.stat().st_mtime_ns for path in out_dir.iterdir()}
    monkeypatch.delenv("IMDB_ARCHIVE")
    tried, download = [], imdb.download_archive
    monkeypatch.setattr(imdb, "download_archive", lambda *args: tried.append(args))
    capsys.readouterr()
    assert ingest.run(load_config(PROJECT_ROOT / "configs" / "smoke.yaml", settings)) == out_dir
    assert "up to date, nothing to do" in capsys.readouterr().out and tried == []
    assert {path.name: path.stat().st_mtime_ns for path in out_dir.iterdir()} == written
    monkeypatch.setattr(imdb, "download_archive", download)  # offline here (port 9), as on a machine without network
    stale = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", [*settings, "data.validation_fraction=0.3"])
    with pytest.raises(
        PipelineError,
        match=rf"could not download .* was last built from {tiny_imdb_archive}: "
        rf"IMDB_ARCHIVE={tiny_imdb_archive} reads it again",
    ):
        ingest.run(stale)
    assert {path.name: path.stat().st_mtime_ns for path in out_dir.iterdir()} == written


# ----------------------------------------------------------------------------- bad input


def assert_fails_cleanly(config, match: str, capsys=None) -> None:
    out_dir = config.data_dir / "ingest"
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        ingest.run(config)
    assert not out_dir.exists()
    assert not [p for p in config.data_dir.glob(".ingest*")] if config.data_dir.exists() else True


def test_missing_archive(smoke_config, tmp_path):
    missing = tmp_path / "nope.tar.gz"
    assert_fails_cleanly(smoke_config.replace(data={"archive": str(missing)}), "nope.tar.gz")


def test_truncated_archive(smoke_config, tiny_imdb_archive, tmp_path):
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(tiny_imdb_archive.read_bytes()[: tiny_imdb_archive.stat().st_size // 2])
    assert_fails_cleanly(
        smoke_config.replace(data={"archive": str(truncated)}), r"truncated\.tar\.gz.*truncated or corrupt"
    )


def test_archive_cut_at_a_member_boundary_is_not_read_as_a_smaller_one(smoke_config, tiny_imdb_archive, tmp_path):
    # A gzip stream cut where the tar stream has a header: tarfile's own gzip reader would end the
    # iteration there without an error and ingestion would see a smaller dataset.
    tar_bytes = gzip.decompress(tiny_imdb_archive.read_bytes())
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as archive:
        boundary = [m.offset for m in archive.getmembers() if "/train/pos/" in m.name][3]
    compressor = zlib.compressobj(wbits=31)
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(compressor.compress(tar_bytes[:boundary]) + compressor.flush(zlib.Z_SYNC_FLUSH))
    assert_fails_cleanly(smoke_config.replace(data={"archive": str(cut)}), r"cut\.tar\.gz.*truncated or corrupt")


def test_not_gzip(smoke_config, tmp_path):
    bogus = tmp_path / "plain.tar.gz"
    bogus.write_text("this is not an archive")
    assert_fails_cleanly(smoke_config.replace(data={"archive": str(bogus)}), r"plain\.tar\.gz.*not a readable")


def test_checksum_mismatch_prints_expected_and_actual(smoke_config, tiny_imdb_archive):
    actual = imdb.sha256_file(tiny_imdb_archive)
    config = smoke_config.replace(data={"archive_sha256": "ab" * 32})
    assert_fails_cleanly(config, f"expected {'ab' * 32}, actual {actual}")
    ingest.run(smoke_config.replace(data={"archive_sha256": actual}))  # the right checksum passes


def test_corrupted_canonical_download_is_detected(smoke_config, tiny_imdb_archive):
    raw = smoke_config.data_dir / "raw" / imdb.CANONICAL_ARCHIVE_NAME
    raw.parent.mkdir(parents=True)
    shutil.copy(tiny_imdb_archive, raw)
    assert_fails_cleanly(smoke_config.replace(data={"archive": None}), "md5 mismatch: expected 7c2ac02c")


@pytest.mark.parametrize(
    "member,kind,linkname",
    [
        ("aclImdb/../../escape.txt", tarfile.REGTYPE, ""),
        ("/etc/evil.txt", tarfile.REGTYPE, ""),
        ("aclImdb/train/pos/99_9.txt.link", tarfile.SYMTYPE, "/etc/passwd"),
        ("aclImdb/train/pos/98_9.txt", tarfile.LNKTYPE, "aclImdb/train/pos/0_9.txt"),
    ],
)
def test_unsafe_members_are_rejected(smoke_config, tiny_imdb_archive, member, kind, linkname):
    add_member(tiny_imdb_archive, member, kind=kind, linkname=linkname)
    assert_fails_cleanly(smoke_config, "refusing archive member")


def test_missing_class_folder(smoke_config, tiny_imdb_dir, tmp_path):
    shutil.rmtree(tiny_imdb_dir / "train" / "pos")
    archive = make_archive(tiny_imdb_dir.parent, tmp_path / "nopos.tar.gz")
    assert_fails_cleanly(smoke_config.replace(data={"archive": str(archive)}), r"nopos\.tar\.gz: no train/pos folder")


def test_empty_class_folder(smoke_config, tiny_imdb_dir, tmp_path):
    for path in (tiny_imdb_dir / "test" / "neg").iterdir():
        path.unlink()
    archive = make_archive(tiny_imdb_dir.parent, tmp_path / "emptyneg.tar.gz")
    assert_fails_cleanly(smoke_config.replace(data={"archive": str(archive)}), "test/neg holds no")
    assert_fails_cleanly(smoke_config.replace(data={"archive": str(tiny_imdb_dir)}), "test/neg holds no")


def test_badly_named_files_are_counted_not_fatal(smoke_config, tiny_imdb_dir, tmp_path, capsys):
    (tiny_imdb_dir / "train" / "pos" / "notes.txt").write_text("not a review")
    (tiny_imdb_dir / "train" / "neg" / "12-3.txt").write_text("bad name")
    (tiny_imdb_dir / "train" / "neg" / "200_2.txt").write_bytes(b"bad bytes \xff here")
    archive = make_archive(tiny_imdb_dir.parent, tmp_path / "names.tar.gz")
    out_dir = ingest.run(smoke_config.replace(data={"archive": str(archive)}))
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["skipped_files"]["count"] == 2
    assert manifest["decode_error_files"] == 1
    assert sum(manifest["rows"][s] for s in ("train", "val")) == 81
    assert "skipped 2 file(s)" in capsys.readouterr().out


def test_failed_rerun_keeps_previous_output(smoke_config, tmp_path):
    out_dir = ingest.run(smoke_config)
    before = {p.name: p.read_bytes() for p in out_dir.iterdir()}
    bogus = tmp_path / "bogus.tar.gz"
    bogus.write_text("garbage")
    with pytest.raises(ValueError):
        ingest.run(smoke_config.replace(data={"archive": str(bogus)}))
    assert {p.name: p.read_bytes() for p in out_dir.iterdir()} == before


def test_cli_reports_error_and_nonzero_exit(tmp_path, capsys):
    missing = tmp_path / "missing.tar.gz"
    code = cli_main(["ingest", "--set", f"data.archive={missing}", "--set", f"paths.data_dir={tmp_path / 'd'}"])
    assert code == 2
    assert "missing.tar.gz" in capsys.readouterr().err


@requires_real_archive
def test_real_archive_counts(tmp_path):
    config = load_config(
        PROJECT_ROOT / "configs" / "default.yaml",
        [f"data.archive={REAL_ARCHIVE}", f"paths.data_dir={tmp_path / 'data'}"],
    )
    out_dir = ingest.run(config)
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["rows"] == {"train": 22500, "val": 2500, "test": 25000}
    assert manifest["labels"]["val"] == {"negative": 1250, "positive": 1250}
    assert manifest["duplicates"]["within_train"] > 0


def write_movie_urls(base: Path, per_class: int, reviews_per_movie: int = 4) -> None:
    """``train/urls_{pos,neg}.txt`` as the canonical archive has them: line i names the movie of review i."""
    for polarity in ("pos", "neg"):
        lines = [
            f"http://www.imdb.com/title/tt{1000 + i // reviews_per_movie:07d}/usercomments" for i in range(per_class)
        ]
        (base / "train" / f"urls_{polarity}.txt").write_text("\n".join(lines) + "\n")


def movies_of(out_dir: Path, split: str) -> set:
    frame = pd.read_parquet(out_dir / f"{split}.parquet")
    return {
        (source.split("/")[1], review_id // 4) for source, review_id in zip(frame["source_file"], frame["review_id"])
    }


def test_validation_holds_whole_movies_when_the_archive_names_them(tmp_path):
    base = write_imdb_tree(tmp_path / "source", per_class={"train": 80, "test": 20}, seed=5)
    write_movie_urls(base, 80)
    archive = make_archive(tmp_path / "source", tmp_path / "with_urls.tar.gz")
    settings = [f"data.archive={archive}", "data.validation_fraction=0.2"]
    grouped = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", settings + [f"paths.data_dir={tmp_path / 'a'}"])
    out_dir = ingest.run(grouped)
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["split_rule"].startswith("whole movies")
    assert manifest["rows"]["train"] + manifest["rows"]["val"] == 160
    assert not movies_of(out_dir, "train") & movies_of(out_dir, "val")
    # the control: the same archive split by review puts movies on both sides
    plain = load_config(
        PROJECT_ROOT / "configs" / "smoke.yaml",
        settings + ["data.group_validation=false", f"paths.data_dir={tmp_path / 'b'}"],
    )
    out_dir = ingest.run(plain)
    assert "group_validation is off" in json.loads((out_dir / "manifest.json").read_text())["split_rule"]
    assert movies_of(out_dir, "train") & movies_of(out_dir, "val")
    # from an extracted folder too
    folder = load_config(
        PROJECT_ROOT / "configs" / "smoke.yaml",
        [f"data.archive={base}", "data.validation_fraction=0.2", f"paths.data_dir={tmp_path / 'c'}"],
    )
    out_dir = ingest.run(folder)
    assert not movies_of(out_dir, "train") & movies_of(out_dir, "val")


def test_an_archive_without_urls_says_its_split_is_by_review(smoke_config):
    manifest = json.loads((ingest.run(smoke_config) / "manifest.json").read_text())
    assert manifest["split_rule"] == "stratified by label, seeded; the archive names no movies"


def test_editing_an_unlabeled_folder_reingests_it(tmp_path, capsys):
    base = write_imdb_tree(tmp_path / "source", per_class={"train": 20, "test": 10}, seed=2, unlabeled=12)
    config = load_config(
        PROJECT_ROOT / "configs" / "smoke.yaml",
        [f"data.archive={base}", f"data.unlabeled_archive={base}", f"paths.data_dir={tmp_path / 'data'}"],
    )
    ingest.run(config)
    ingest.run(config)
    assert "up to date" in capsys.readouterr().out
    review = base / "train" / "unsup" / "3_0.txt"
    stat = review.stat()
    review.write_text(review.read_text().upper())  # same size, and the timestamp put back
    import os

    os.utime(review, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    ingest.run(config)
    assert "up to date" not in capsys.readouterr().out
    unlabeled = pd.read_parquet(tmp_path / "data" / "ingest" / "unlabeled.parquet")["text"]
    assert unlabeled.str.isupper().sum() == 1
