"""Run a module as ``python -m`` would, with TensorFlow (and tf-text) not importable, as on the GPU machine.

``python tests/experiments/no_tensorflow.py -m lab gpu-check ...``
"""

import runpy
import sys

BLOCKED = ("tensorflow", "tensorflow_text", "tf_keras")


class NoTensorFlow:
    """A finder that answers every import of a blocked package with ``ModuleNotFoundError``, as if not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(
                f"No module named {name!r} (blocked: the GPU machine has no TensorFlow)", name=name
            )
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, NoTensorFlow())
    if sys.argv[1:2] != ["-m"] or len(sys.argv) < 3:
        raise SystemExit("usage: no_tensorflow.py -m MODULE [ARGS...]")
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
