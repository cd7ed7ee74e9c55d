from pipeline.tracking import MODEL_KIND_TAG, model_kind, selection_accuracy


def test_a_runs_model_kind_reads_the_names_runs_were_tagged_with_before():
    assert model_kind({MODEL_KIND_TAG: "lexical"}) == "nbsvm"  # NBSVM runs logged before the rename
    assert model_kind({MODEL_KIND_TAG: "nbsvm"}) == "nbsvm"
    assert model_kind({MODEL_KIND_TAG: "fusion"}) == "fusion"
    assert model_kind({}) == "transformer"  # Transformer runs logged before the tag existed


def test_a_run_is_chosen_by_its_best_epoch_or_its_cross_fitted_accuracy_old_names_too():
    assert selection_accuracy({"best_val_accuracy": 0.88, "val_accuracy": 0.87}) == 0.88  # a Transformer
    nbsvm = {"val_accuracy_chosen_c": 0.91, "val_accuracy_cross_fitted": 0.9}
    assert selection_accuracy(nbsvm) == 0.9  # never the accuracy of the C chosen on those rows
    assert selection_accuracy({"val_accuracy_chosen_c": 0.91, "best_val_accuracy": 0.9}) == 0.9  # logged before 2026-12
    assert selection_accuracy({"test_accuracy": 0.9}) is None
