"""The server's pure pieces: client matching, the classifier exchange, aggregation and the
checks that drop failed clients or bad updates."""
