"""Probes: one-off measurements behind figures in ``docs/history/``, each a script run from a checkout as
``python -m lab.probes.<name>`` (``--help`` says what it reads). They call the product's functions (the comparison's
fusion, cascade and champion rule, the stages' readers), so a probe measures what the product does.
"""
