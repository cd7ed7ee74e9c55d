"""Command line of the lab: ``python -m lab <experiment> [--config FILE] [--set section.key=value ...]``.

The sub-commands come from the experiments' table (:data:`lab.experiments.EXPERIMENTS`) and take the arguments the
product's stages take (``--config``, ``--set``, ``--force`` where honoured, their own options); parsing, errors and
exit status are the product's command line's (:mod:`pipeline.__main__`).
"""

from __future__ import annotations

import argparse
import sys

from lab.experiments import EXPERIMENTS
from pipeline import __main__ as product_cli


def build_parser() -> argparse.ArgumentParser:
    return product_cli.build_parser(EXPERIMENTS, "python -m lab", __doc__ or "")


def main(argv: list[str] | None = None) -> int:
    return product_cli.run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
