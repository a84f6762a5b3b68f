"""The `credo` command: its subcommands (main.py), the options they share (options.py), train's flags (train.py) and
`make demo` (demo.py)."""
