"""Drop-in credo credit for the trainers users already run (TRL, verl)."""
