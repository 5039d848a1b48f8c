"""A client's side: the models (and, torch-free, their architectures' names and shapes) with
their extractor/classifier split, the compute choice (precision, layout), the one local-training
loop and its hooks, evaluation and per-class features."""
