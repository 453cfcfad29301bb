"""One run: prepared, announced, trained by its backend, judged at its end; on several processes, launched."""
