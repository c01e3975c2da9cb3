"""The ``kernel-sandbox`` command line: one module per command group."""
