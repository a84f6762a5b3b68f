"""`credo compare`: methods trained side by side on one schedule and token budget, with intervals over seeds."""
