"""Core: what every stage shares about files and mistakes. ``catalog`` (the stage table entry, each stage's output
folder, every file name stages hand on), ``files`` (checksums, atomic writes, manifests), ``errors`` (the mistakes a
user can fix), ``checkpoints`` (where a pretrained checkpoint lives, its hub and its licence), ``old_models`` (the
names that let models logged by earlier versions load), ``logs``, ``plots`` and ``predictions`` (the one prediction
shape, ``[N, k]`` probabilities)."""
