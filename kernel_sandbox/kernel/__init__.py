"""Kernel layer: connection files, the jupyter_client session, iopub → nbformat outputs.

Knows nothing of containers, tools or agents.
"""
