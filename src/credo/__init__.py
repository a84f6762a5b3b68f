"""credo: credit assignment for RL with verifiable rewards on reasoning language models."""

__version__ = "0.1.0"
