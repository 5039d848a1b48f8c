"""What a run yields: the per-round record and the run's summary (final accuracy and the
paper's Table II/III forms). Light: no torch, so reports import it cheaply."""
