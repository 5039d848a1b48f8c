"""The ground floor of the library: random streams (seed, round, client), atomic files and
checkpoints, file locks, the config models' frozen base and modules imported on first use.
It imports nothing else of ``fedcme_core``."""
