"""The lab: experiments and probes that study the product (``pipeline/``), kept beside it and out of its install.

- ``experiments/``: the research runners behind the experiment ``make`` targets, declared in
  :data:`lab.experiments.EXPERIMENTS` and run by ``python -m lab <experiment> --config FILE --set section.key=value``;
- ``probes/``: one-off scripts behind figures in ``docs/history/`` (``python -m lab.probes.<name> --help``).

The lab imports the product; the product never imports the lab (``tests/test_layout.py``). It runs from a checkout
(the wheel ships ``pipeline`` only) and its extra packages (ONNX Runtime, Optuna) are the ``lab`` extra of
``pyproject.toml``.
"""
