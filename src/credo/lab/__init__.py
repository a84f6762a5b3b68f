"""The lab: `credo audit` (how right is each method's credit), `credo compare` (what it buys in accuracy, on one
budget) and `credo show` (the credit made visible). The lab may import everything; nothing in the library imports it."""
