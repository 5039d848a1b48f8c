"""What every part of the orchestration shares: one-line errors, the commands' settings, the process table and the
first use of the sqlite stores that Prefect and MLflow share."""
