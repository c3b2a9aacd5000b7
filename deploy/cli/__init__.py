"""The `lambda-platform` command line: its parser, its commands, and what they print."""
