"""MLflow: a training run (run), its store (store), a grid's parent run (grid), the background writer (writer),
after-the-fact sync (sync), and what a run shows in the UIs: names, tags, links and figures (names, views)."""
