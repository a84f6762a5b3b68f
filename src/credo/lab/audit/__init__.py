"""`credo audit`: credit against the Monte-Carlo reference, its cost, and the premises a method assumes."""
