"""The results report of a grid: tables over seeds, paired statistics, figures, the paper's
claims, published figures beside ours, the sensitivity study and what DVC shows."""
