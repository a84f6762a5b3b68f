"""`credo show`: the per-token credit of each method, as a page or in the terminal."""
