"""Text: raw review text to token ids. ``conventions`` (cleaning, reserved ids, label files), ``encoder`` (the
``TextEncoder`` protocol and loading a saved one), ``wordpiece`` (the pipeline's own WordPiece encoder) and
``presets`` (a pretrained KerasHub preset's tokenizer)."""
