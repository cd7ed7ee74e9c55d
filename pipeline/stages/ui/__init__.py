"""``make ui``: print links to the runs table and the latest comparison, then serve the MLflow UI on 127.0.0.1.

Reads:  the tracking store (``MLFLOW_TRACKING_URI``, default ``sqlite:///mlflow.db``).
Writes: nothing; ``mlflow server`` runs in the foreground until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

from pipeline.config import Config
from pipeline.runtime.local_http import require_free_port
from pipeline.stages.ui.links import experiment_url, latest_comparison, run_url, server_command
from pipeline.tracking import tracking_uri


def main(config: Config, args) -> None:
    """``make ui``: print where to look, then serve the UI until Ctrl-C."""
    if not args.print_only:
        require_free_port(args.port, "127.0.0.1", "UI_PORT")
    comparison = latest_comparison(config.tracking)
    base = f"http://127.0.0.1:{args.port}"
    print(f"ui: MLflow UI for {tracking_uri(config.tracking)} at {base} (Ctrl-C to stop)")
    print(f"ui: runs table  {experiment_url(base, comparison.experiment_id)}")
    if comparison.parent_id:
        print(
            f"ui: latest comparison ({comparison.parent_name}, {len(comparison.child_ids)} model runs)  "
            f"{run_url(base, comparison.experiment_id, comparison.parent_id)}"
        )
    else:
        print("ui: no comparison yet (`make compare`)")
    sys.stdout.flush()
    if args.print_only:
        return
    with contextlib.suppress(KeyboardInterrupt):
        subprocess.run(server_command(tracking_uri(config.tracking), args.port), check=False)
