"""Audits of the product as a whole: a same-machine A/B of a refactor (``refactor_check``), kills of ``make all``
(``faults``)."""
