"""The DVC pipeline: its stages (``dvc.yaml``), the params paths they read, and ``dvc repro``
with one Prefect server for the whole grid."""
