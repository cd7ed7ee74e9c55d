"""The comparison's producers: NBSVM's training rows, as logged, and the steps it says as it fits."""

import mlflow
import pytest

from pipeline.core.catalog import require_output
from pipeline.stages.compare.producers import nbsvm_candidate
from pipeline.stages.tokenize.outputs import read_ingested_rows
from pipeline.tracking import setup_tracking
from tests.conftest import PREPARED_UNLABELED


@pytest.mark.parametrize("per_unlabeled_review", [2, 0])
def test_nbsvm_reads_crops_of_the_ingested_unlabeled_reviews(prepared_config, per_unlabeled_review, capsys):
    config = prepared_config.replace(nbsvm={"unlabeled_crops_per_review": per_unlabeled_review})
    frames = read_ingested_rows(require_output(config, "ingest"), require_output(config, "tokenize"))
    setup_tracking(config.tracking)
    candidate = nbsvm_candidate(config, "k", frames, frames.labels, frames.ingest_manifest_sha256, force=False)
    params = mlflow.get_run(candidate.run_id).data.params
    assert params["nbsvm.unlabeled_reviews"] == str(PREPARED_UNLABELED if per_unlabeled_review else 0)
    assert params["nbsvm.unlabeled_crops_per_review"] == str(per_unlabeled_review)
    said = capsys.readouterr().out
    assert (f"{per_unlabeled_review} of each of {PREPARED_UNLABELED} unlabeled reviews" in said) == bool(
        per_unlabeled_review
    )
    assert len(candidate.predictions) == len(frames.test)
    steps = [line for line in said.splitlines() if line.startswith("compare: NBSVM: ")]
    assert steps[0].startswith(f"compare: NBSVM: 1-3-gram counts of {len(frames.train)} train reviews (0m")
    assert (
        f"compare: NBSVM: {per_unlabeled_review} crops of each of {PREPARED_UNLABELED} unlabeled reviews, "
        "labelled by an NBSVM fitted on the train reviews" in said
    ) == bool(per_unlabeled_review)
    assert [line.split(" on ")[0] for line in steps if " [" in line] == [  # a line per C, as each fit starts
        f"compare: NBSVM: C {c:g} [{index}/{len(config.nbsvm.c_values)}]"
        for index, c in enumerate(sorted(config.nbsvm.c_values), 1)
    ]
    assert all(line.endswith(" elapsed)") for line in steps)
