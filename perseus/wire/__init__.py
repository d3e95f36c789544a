"""The wire models, one module per concern; :mod:`perseus.schemas` re-exports them all."""
