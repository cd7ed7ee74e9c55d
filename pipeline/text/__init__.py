"""Text: raw review text to token ids. ``conventions`` (cleaning, reserved ids, label files), ``text_tokenizer``
(the ``TextTokenizer`` protocol and loading a saved one), ``wordpiece`` (the pipeline's own WordPiece tokenizer) and
``preset_tokenizer`` (a pretrained KerasHub preset's tokenizer). "Tokenizer" names these; "encoder" names the network
(``pipeline.model``)."""
