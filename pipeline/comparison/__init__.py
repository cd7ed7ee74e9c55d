"""The comparison every candidate for ``@champion`` goes through, as typed parts.

- ``designs``: what a comparison varies (the compare section's factors; ``designs.yaml`` for the experiments);
- ``candidates``: :class:`~pipeline.comparison.candidates.Candidate`, and one producer per kind
  (Transformer variant and seed, NBSVM, fusion, TF-IDF reference);
- ``effects``: summaries, factor effects and the recommendation, from candidates (statistics: ``pipeline.metrics``);
- ``report``: the verdict, the Markdown/JSON report, the plot, the MLflow descriptions;
- ``runner``: :func:`~pipeline.comparison.runner.run_comparison`, the loop that asks for candidates and hands
  them on (``make compare`` and the ``compare-tuned`` and ``ablate-position`` experiments call it).

Importing this package imports nothing heavy; import its modules.
"""
